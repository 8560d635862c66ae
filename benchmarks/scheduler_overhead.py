"""Scheduler overhead per step: schedule + apply the step's result, no model.

Steady decode at 16, 64, 256 and 1,024 running requests (128-token prompts, block size 16,
ample blocks), and a KV-pressure case (256 requests, 10 blocks each, preemptions every few
steps). Each row also times a bare loop doing the unavoidable part of the same work (one
token and, every 16 tokens, one block per sequence) in the same run, and prints our step as a
ratio of it; vLLM's own figures (research/vllm.md §6, measured on a 2-core machine like this
one, not in this run) are printed beside ours for reference.

The main columns run sequence by sequence (``decode_lane=False``), as vLLM's scheduler does;
"lane ms" is the same case with the decode lane the simulator uses (plain decodes advanced
together, see ``executors/decode_lane.py``), measured in the same run.

    python benchmarks/scheduler_overhead.py [--steps 200]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from kvsched import Engine, EngineConfig, Request, SamplingParams
from kvsched.executors.simulated import SimulatedExecutor

VLLM_V0_MS = {16: 0.13, 64: 0.47, 256: 1.97, 1024: 16.8}  # v0.6.3 _schedule()
VLLM_V1_MS = {16: 0.035, 64: 0.131, 256: 0.53, 1024: 2.31}  # V1 0.8.5 schedule()


def build(n: int, blocks_per_request: int | None, lane: bool, prompt: int = 128, output: int = 100_000) -> Engine:
    blocks = n * (blocks_per_request or 64)
    config = EngineConfig(
        block_size=16, num_gpu_blocks=blocks, num_cpu_blocks=blocks, watermark=0.0,
        max_num_seqs=n, max_num_batched_tokens=max(prompt * n, n), max_model_len=10**6, decode_lane=lane,
    )
    engine = Engine(config, "vllm-default", SimulatedExecutor())
    for i in range(n):
        engine.add_request(Request(request_id=f"r{i}", prompt_len=prompt, output_len=output,
                                   sampling=SamplingParams(max_tokens=output)))
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
            engine._apply(out, result.tokens, engine.clock.now())
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    print(f"{'case':>22} {'median ms':>10} {'p99 ms':>8} {'µs/req':>7} {'× bare loop':>12} {'lane ms':>8} "
          f"{'vLLM v0 ms':>11} {'vLLM V1 ms':>11}")
    for n in (16, 64, 256, 1024):
        (times, _), (lane, _) = (time_steps(steady(n, on), args.steps) for on in (False, True))
        med = statistics.median(times)
        base = bare_loop(n, args.steps)
        print(f"{'decode, ' + str(n) + ' running':>22} {med * 1e3:10.3f} {p99(times) * 1e3:8.3f} {med / n * 1e6:7.2f} "
              f"{med / base:12.1f} {statistics.median(lane) * 1e3:8.3f} {VLLM_V0_MS[n]:11.3f} {VLLM_V1_MS[n]:11.3f}")
    (times, preempted), (lane, _) = (time_steps(build(256, 10, on), 300) for on in (False, True))
    med = statistics.median(times)
    print(f"{'KV pressure, 256':>22} {med * 1e3:10.3f} {p99(times) * 1e3:8.3f} {med / 256 * 1e6:7.2f} "
          f"{'':>12} {statistics.median(lane) * 1e3:8.3f} {1.61:11.3f} {0.32:11.3f}   ({preempted} preemptions in 300 steps)")


def steady(n: int, lane: bool) -> Engine:
    """``n`` requests admitted and all decoding."""
    engine = build(n, None, lane)
    while len(engine.scheduler.running) < n or any(g.num_uncomputed_tokens > 1 for g in engine.scheduler.running):
        engine.step()
    return engine


if __name__ == "__main__":
    main()
