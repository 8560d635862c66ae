"""Where a batch-64 CPU decode step of SmolLM2-135M goes, and how close its matmuls are to this core's speed.

Runs the 64 benchmark prompts of ``real_throughput.py`` through our engine (1 torch thread, the
same config), lets decode settle, then over ``--steps`` pure decode steps splits the step time
into the linear layers (``aten::mm``/``aten::addmm`` in a torch profile), our paged attention
(timed around the backend call) and the rest (norms, RoPE, activations, sampling, Python).
Finally it times each linear-layer shape of the model alone, with the same batch of 64 rows, for
the GFLOP/s this core reaches without the rest of the model around it.

    .venv/bin/python benchmarks/cpu_decode_profile.py        # about a minute
"""

from __future__ import annotations

import argparse
import time

import torch
from real_throughput import requests_for  # the sibling benchmark: same prompts, same requests
from torch.profiler import ProfilerActivity, profile

from kvsched.core.config import EngineConfig
from kvsched.executors.hf import hf_engine
from kvsched.executors.hf_models import load_model
from kvsched.executors.hf_prompts import benchmark_prompts

LINEAR_OPS = ("aten::mm", "aten::addmm")


def isolated_gflops(rows: int, k: int, n: int, iters: int = 20) -> float:
    x, w = torch.randn(rows, k), torch.randn(n, k)
    for _ in range(3):
        torch.nn.functional.linear(x, w)
    start = time.perf_counter()
    for _ in range(iters):
        torch.nn.functional.linear(x, w)
    return 2 * rows * k * n * iters / (time.perf_counter() - start) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="decode steps profiled")
    args = ap.parse_args()
    torch.set_num_threads(1)
    loaded = load_model("smollm2-135m")
    config = EngineConfig(
        block_size=16, num_gpu_blocks=1024, num_cpu_blocks=64, max_num_seqs=64, max_num_batched_tokens=512
    )
    engine = hf_engine(loaded, config)
    for r in requests_for(loaded, benchmark_prompts(64), [128] * 64):
        engine.add_request(r)
    while engine.scheduler.waiting or any(
        g.seqs[0].num_computed_tokens < len(g.seqs[0].prompt) for g in engine.scheduler.running
    ):
        engine.step()
    for _ in range(10):  # past the first decode steps
        engine.step()

    executor, attention_s = engine.executor, [0.0]
    attend = executor.attend

    def timed_attend(*a, **kw):
        start = time.perf_counter()
        out = attend(*a, **kw)
        attention_s[0] += time.perf_counter() - start
        return out

    executor.attend = timed_attend
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        step_s = (time.perf_counter() - start) / args.steps
    executor.attend = attend
    linear_s = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in LINEAR_OPS) / 1e6 / args.steps
    attn_s = attention_s[0] / args.steps
    running = len(engine.scheduler.running)
    cfg = loaded.model.config
    hidden, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (hidden // cfg.num_attention_heads)
    flops = (
        2
        * running
        * (cfg.num_hidden_layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter) + hidden * vocab)
    )

    print(
        f"decode step with {running} running sequences (mean of {args.steps}, under the profiler): {1e3 * step_s:.0f} "
        "ms"
    )
    print(f"  linear layers   {1e3 * linear_s:6.0f} ms  ({flops / linear_s / 1e9:.0f} GFLOP/s)")
    print(f"  paged attention {1e3 * attn_s:6.0f} ms")
    print(f"  everything else {1e3 * (step_s - linear_s - attn_s):6.0f} ms")
    print(f"\nthe same linear shapes alone, {running} rows, GFLOP/s:")
    for name, k, n in (
        ("q/o proj", hidden, hidden),
        ("k/v proj", hidden, kv),
        ("gate/up", hidden, inter),
        ("down", inter, hidden),
        ("LM head", hidden, vocab),
    ):
        print(f"  {name:<9} {k:>5} -> {n:<6} {isolated_gflops(running, k, n):6.0f}")


if __name__ == "__main__":
    main()
