"""Scheduler time per step inside vLLM: ``KvschedScheduler`` (policy ``vllm-v1``) against vLLM's own ``Scheduler``.

No model: both are vLLM scheduler classes in this process, built and driven as
``scheduler_overhead.py`` drives V1's (``v1_scheduler``, ``v1_step``: fake model outputs of one
token per request, as vLLM's ``tests/v1/core/utils.py`` does), on the same cases: steady decode at
16, 64, 256 and 1,024 running requests (128-token prompts, block size 16, ample blocks), and KV
pressure (256 requests, 10 blocks each: preemptions every few steps, timed from the first step,
its prefills included).
A step is ``schedule()`` + ``update_from_output()``, the time vLLM's engine core spends in its
scheduler; ours includes the policy's step on the mirror, its replay on vLLM's state and the
mirror's update.

The two sides are interleaved step by step (which goes first alternates), so a noisy machine
slows both alike; each round builds a fresh pair. Steps are timed on the thread's CPU clock by
default (``--clock cpu``: the work a step does, not the time it waited for a core on a shared
machine), or on the wall clock (``--clock wall``). Every step both must schedule the same tokens
per request and preempt the same requests, and hold the same free blocks after it: a difference
is printed and the run exits non-zero (the comparison would not be like for like). Prints, per
case, each side's median ms per step (the median over rounds of each round's median), the ratio
ours / vLLM's (the median over rounds of each round's ratio) and its range over rounds.

    .venv/bin/python benchmarks/vllm_scheduler_overhead.py [--steps 200] [--rounds 5] [--clock wall] [--cprofile CASE]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import time

from scheduler_overhead import v1_scheduler, v1_steady, v1_step

CASES = {f"decode-{n}": (n, None) for n in (16, 64, 256, 1024)} | {"kv-pressure-256": (256, 10)}
OURS = {"kvsched": {"policy": "vllm-v1"}}


def pair(n: int, blocks: int | None):
    """vLLM's ``Scheduler`` and ``KvschedScheduler`` on the same case, both at its starting point."""
    from kvsched.integrations.vllm.scheduler import KvschedScheduler

    sides = v1_scheduler(n, blocks), v1_scheduler(n, blocks, cls=KvschedScheduler, additional_config=OURS)
    if blocks is None:
        for scheduler in sides:
            v1_steady(scheduler)
    return sides


def seen(scheduler, out) -> tuple:
    """What a step did, as the two sides are compared on."""
    return (
        dict(out.num_scheduled_tokens),
        set(out.preempted_req_ids or ()),
        scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
    )


def check(ours) -> None:
    """Our side must still be deciding: a fault or a given-up mirror would time something else."""
    if ours.abandoned is not None or ours.faults.counts:
        sys.exit(f"KvschedScheduler gave up or counted faults: {ours.abandoned or ours.faults.counts}")


def round_times(n: int, blocks: int | None, steps: int, clock) -> tuple[list[float], list[float]]:
    """Per-step seconds on ``clock`` (vLLM's, ours) of one fresh pair, interleaved, every step compared."""
    theirs, ours = pair(n, blocks)
    check(ours)
    times: tuple[list[float], list[float]] = ([], [])
    gc.collect()
    gc.disable()
    try:
        for i in range(steps):
            order = (0, 1) if i % 2 == 0 else (1, 0)
            results = {}
            for side in order:
                scheduler = (theirs, ours)[side]
                s, u, out = v1_step(scheduler, clock)
                times[side].append(s + u)
                results[side] = seen(scheduler, out)
            if results[0] != results[1]:
                sys.exit(f"step {i}: the schedules differ\n  vLLM: {results[0]}\n  ours: {results[1]}")
    finally:
        gc.enable()
    check(ours)
    return times


def profile(case: str, steps: int) -> None:
    """cProfile of our side alone on ``case``: where its time per step goes."""
    n, blocks = CASES[case]
    _, ours = pair(n, blocks)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        v1_step(ours)
    profiler.disable()
    check(ours)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="timed steps per round and case")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--clock", choices=("cpu", "wall"), default="cpu", help="the thread's CPU time (default) or wall time"
    )
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--cprofile", choices=list(CASES), help="profile our side on this case instead")
    args = ap.parse_args()
    if args.cprofile:
        profile(args.cprofile, args.steps)
        return
    import vllm

    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    print(
        f"vLLM {vllm.__version__}: its Scheduler and KvschedScheduler (vllm-v1) in this process, interleaved step by "
        f"step, {args.rounds} rounds, {args.steps} steps each, {args.clock} clock; same schedules checked every step"
    )
    print(f"{'case':>16} {'vLLM ms/step':>13} {'ours ms/step':>13} {'ours / vLLM':>12} {'range over rounds':>18}")
    for case in args.cases:
        n, blocks = CASES[case]
        rounds = [
            [statistics.median(side) for side in round_times(n, blocks, args.steps, clock)] for _ in range(args.rounds)
        ]
        theirs, ours = (statistics.median(r[side] for r in rounds) for side in (0, 1))
        ratios = [r[1] / r[0] for r in rounds]
        print(
            f"{case:>16} {theirs * 1e3:13.3f} {ours * 1e3:13.3f} {statistics.median(ratios):11.3f}× "
            f"{min(ratios):8.3f}–{max(ratios):.3f}×",
            flush=True,
        )


if __name__ == "__main__":
    main()
