"""Scheduler overhead per step: schedule + apply the step's result, no model; vLLM V1's beside it.

The headline is like for like: our ``vllm-v1`` (V1's rules: recompute preemption, one token budget)
against vLLM V1's own ``Scheduler`` doing ``schedule()`` + ``update_from_output()`` on the same
case. ``vllm-default`` (v0's rules: swapping, the delay gate, prefill-only steps) is timed in the
same run and labelled as what it is: another algorithm, not a speed comparison with V1.

Steady decode at 16, 64, 256 and 1,024 running requests (128-token prompts, block size 16,
ample blocks), and a KV-pressure case (256 requests, 10 blocks each, preemptions every few
steps). Each row also times a bare loop doing the unavoidable part of the same work (one
token and, every 16 tokens, one block per sequence) in the same run, and prints our step as a
ratio of it.

Our step is ``Scheduler.schedule()`` (the policy through pluggy, every validation) plus
``Completion.apply`` (computed-token counts, sampled tokens, stop checks); the simulated executor's
token generation is excluded. The main columns run sequence by sequence (``decode_lane=False``),
as vLLM's scheduler does; "lane ms" is the same case with the simulator's decode lane
(``executors/decode_lane.py``). When vLLM is installed (the ``vllm`` extra), the same cases run
through vLLM V1's own ``Scheduler`` in the same process, without a model, driven as vLLM's unit
tests drive it (``tests/v1/core/utils.py``): ``schedule()`` is timed alone ("V1 sched") and with
``update_from_output()`` (one sampled token per request: "V1 sched+upd", the like-for-like
column). Nothing is printed that this run did not measure.

    python benchmarks/scheduler_overhead.py [--steps 200] [--no-vllm]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from kvsched import Engine, EngineConfig, Request, SamplingParams
from kvsched.executors.simulated import SimulatedExecutor


def build(
    n: int, blocks_per_request: int | None, lane: bool, policy: str, prompt: int = 128, output: int = 100_000
) -> Engine:
    blocks = n * (blocks_per_request or 64)
    config = EngineConfig(
        block_size=16,
        num_gpu_blocks=blocks,
        num_cpu_blocks=blocks,
        watermark=0.0,
        max_num_seqs=n,
        max_num_batched_tokens=max(prompt * n, n),
        max_model_len=10**6,
        decode_lane=lane,
    )
    engine = Engine(config, policy, SimulatedExecutor())
    for i in range(n):
        engine.add_request(
            Request(
                request_id=f"r{i}", prompt_len=prompt, output_len=output, sampling=SamplingParams(max_tokens=output)
            )
        )
    return engine


def time_steps(engine: Engine, steps: int) -> tuple[list[float], int]:
    """Per-step seconds of schedule + apply (the executor's token generation is excluded)."""
    sched, executor = engine.scheduler, engine.executor
    times, preempted = [], 0
    gc.disable()
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            out = sched.schedule(engine.clock.now())
            t1 = time.perf_counter()
            result = executor.execute(out)
            t2 = time.perf_counter()
            engine.clock.advance(result.duration)
            engine.completion.apply(out, result.tokens, engine.clock.now())
            t3 = time.perf_counter()
            times.append((t1 - t0) + (t3 - t2))
            preempted += len(out.preempted)
    finally:
        gc.enable()
    return times, preempted


def bare_loop(n: int, steps: int) -> float:
    """Median seconds of the floor: append a token per sequence, a block every 16 tokens."""
    tokens = [list(range(129)) for _ in range(n)]
    tables = [[0] * 9 for _ in range(n)]
    free = list(range(n * 64))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for toks, table in zip(tokens, tables):
            if len(toks) > len(table) * 16:
                table.append(free.pop())
            toks.append(1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))]


def v1_scheduler(
    n: int,
    blocks_per_request: int | None,
    prompt: int = 128,
    output: int = 100_000,
    cls=None,
    additional_config: dict | None = None,
):
    """vLLM V1's ``Scheduler`` (or its subclass ``cls``, given ``additional_config``) with ``n`` requests added,
    configured as ``build`` configures ours."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams as V1Sampling
    from vllm.v1.core.sched.scheduler import Scheduler as V1Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request as V1Request
    from vllm.v1.structured_output import StructuredOutputManager

    from kvsched.executors.hf_models import model_folder

    blocks = n * (blocks_per_request or 64)
    model = ModelConfig(model=str(model_folder("smollm2-135m")), dtype="float32", seed=0, skip_tokenizer_init=True)
    sched = SchedulerConfig(
        max_num_seqs=n,
        max_num_batched_tokens=max(prompt * n, n),
        max_model_len=10**6,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=16, gpu_memory_utilization=0.9, enable_prefix_caching=False)
    cache.num_gpu_blocks = blocks
    config = VllmConfig(
        scheduler_config=sched, model_config=model, cache_config=cache, additional_config=additional_config or {}
    )
    kv = KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
            )
        ],
    )
    scheduler = (cls or V1Scheduler)(
        vllm_config=config,
        kv_cache_config=kv,
        block_size=16,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(config),
    )
    params = V1Sampling(ignore_eos=True, max_tokens=output)
    for i in range(n):
        scheduler.add_request(
            V1Request(request_id=f"r{i}", prompt_token_ids=[i] * prompt, sampling_params=params, pooling_params=None)
        )
    return scheduler


def v1_step(scheduler, clock=time.perf_counter) -> tuple[float, float, object]:
    """(schedule seconds, update_from_output seconds, the step's ``SchedulerOutput``) of one V1 step on ``clock``;
    one token per finished chunk."""
    from vllm.v1.outputs import ModelRunnerOutput

    t0 = clock()
    out = scheduler.schedule()
    t1 = clock()
    ids = list(out.num_scheduled_tokens)
    result = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[1]] * len(ids)
    )
    t2 = clock()
    scheduler.update_from_output(out, result)
    t3 = clock()
    return t1 - t0, t3 - t2, out


def v1_steady(scheduler) -> None:
    """Step ``scheduler`` until every request it holds runs and decodes (as ``steady`` does for ours)."""
    n = len(scheduler.requests)
    while len(scheduler.running) < n or any(r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running):
        v1_step(scheduler)
    v1_step(scheduler)


def time_v1(n: int, blocks_per_request: int | None, steps: int) -> tuple[list[float], list[float], int]:
    """V1 per-step times after warm-up to steady decode, or under KV pressure from the start."""
    scheduler = v1_scheduler(n, blocks_per_request)
    if blocks_per_request is None:
        v1_steady(scheduler)
    sched, both, preempted = [], [], 0
    gc.disable()
    try:
        for _ in range(steps):
            s, u, out = v1_step(scheduler)
            sched.append(s)
            both.append(s + u)
            preempted += len(out.preempted_req_ids or ())
    finally:
        gc.enable()
    return sched, both, preempted


def vllm_version() -> str | None:
    try:
        import vllm
    except Exception:  # not installed, or its import fails on this machine: then V1 is not measured
        return None
    return vllm.__version__


def measure(label: str, n: int, blocks: int | None, steps: int, policy: str) -> tuple[list[float], list[float], int]:
    """(per-step seconds sequence by sequence, the same with the decode lane, preemptions) for one policy."""
    engine = (lambda lane: steady(n, lane, policy)) if blocks is None else (lambda lane: build(n, blocks, lane, policy))
    (times, preempted), (lane, _) = (time_steps(engine(on), steps) for on in (False, True))
    return times, lane, preempted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM V1's scheduler")
    args = ap.parse_args()
    version = None if args.no_vllm else vllm_version()
    print(
        "vLLM V1: "
        + (f"{version}, its Scheduler in this process" if version else "not measured (not installed or --no-vllm)")
    )
    print(
        "ours: vllm-v1 (V1's rules, like for like with V1); last column: vllm-default (v0's rules, another algorithm)"
    )
    head = f"{'case':>22} {'median ms':>10} {'p99 ms':>8} {'µs/req':>7} {'× bare loop':>12} {'lane ms':>8}"
    print(
        head
        + (f" {'V1 sched ms':>12} {'V1 sched+upd':>13} {'V1 / ours':>10}" if version else "")
        + f" {'v0 rules ms':>12}"
    )
    cases = [(f"decode, {n} running", n, None, args.steps) for n in (16, 64, 256, 1024)] + [
        ("KV pressure, 256", 256, 10, 300)
    ]
    for label, n, blocks, steps in cases:
        times, lane, preempted = measure(label, n, blocks, steps, "vllm-v1")
        v0_times, _, v0_preempted = measure(label, n, blocks, steps, "vllm-default")
        med = statistics.median(times)
        ratio = f"{med / bare_loop(n, steps):12.1f}" if blocks is None else f"{'':>12}"
        line = (
            f"{label:>22} {med * 1e3:10.3f} {p99(times) * 1e3:8.3f} {med / n * 1e6:7.2f} {ratio} "
            f"{statistics.median(lane) * 1e3:8.3f}"
        )
        if version:
            sched, both, v1_preempted = time_v1(n, blocks, steps)
            line += (
                f" {statistics.median(sched) * 1e3:12.3f} {statistics.median(both) * 1e3:13.3f} "
                f"{statistics.median(both) / med:9.1f}×"
            )
        line += f" {statistics.median(v0_times) * 1e3:12.3f}"
        if blocks is not None:
            line += (
                f"   (preemptions in {steps} steps: vllm-v1 {preempted}"
                + (f", V1 {v1_preempted}" if version else "")
                + f", vllm-default {v0_preempted})"
            )
        print(line, flush=True)


def steady(n: int, lane: bool, policy: str) -> Engine:
    """``n`` requests admitted and all decoding."""
    engine = build(n, None, lane, policy)
    while len(engine.scheduler.running) < n or any(g.num_uncomputed_tokens > 1 for g in engine.scheduler.running):
        engine.step()
    return engine


if __name__ == "__main__":
    main()
