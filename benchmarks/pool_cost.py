"""What the GPU pool's bulk calls cost a block, inside a real run and alone (issue 35's long/short ratio).

One replica runs a workload with the settings of ``long_context_speed.py`` (``vllm-v1``, prefix caching, 29,276
blocks of 16 tokens), with a CPU timer around each of the pool's bulk calls: naming blocks (``register``), taking
blocks (``allocate_many``, the evicted blocks' ``forget`` inside it), dropping their names on eviction
(``forget``) and giving a table back (``release_many``). Each call's arguments are kept; the same calls are then
replayed, with the same timers, on a fresh pool in the same process, where nothing else runs between them. Prints
one JSON line: the run's CPU seconds, and per call its CPU seconds, the blocks it handled and the nanoseconds a
block, in the run and alone. A call that costs a block much more in the run than alone waits on memory the rest
of the engine displaced (a cold entry of the hash index), which no faster code of the call itself removes.

Run it on any build of ``kvsched.allocators`` (a compiled one on ``PYTHONPATH``, say) to compare builds:

    .venv/bin/python benchmarks/pool_cost.py --workload long-context -n 3000
    .venv/bin/python benchmarks/pool_cost.py --workload azure-conv -n 5000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import bounded  # noqa: E402
from long_context_speed import SETTINGS, WORKLOADS  # noqa: E402

# The timed calls, each with the number of blocks it handles (its first argument, or allocate_many's count).
CALLS = {"register": len, "allocate_many": int, "forget": len, "release_many": len}
ONE_BLOCK = ("allocate", "take", "take_many", "release")  # not timed (a block a call, or a prompt's hits), but replayed


def timed(pool_class, log: list | None) -> dict[str, list[int]]:
    """Wrap the pool's bulk calls with CPU timers (nanoseconds and blocks, summed per call); with ``log``, also
    keep each outermost GPU call's arguments there, of the one-block calls too. Returns the sums, which fill as
    the calls run (until the class's own methods are put back)."""
    sums = {name: [0, 0] for name in CALLS}
    depth = [0]  # forget runs inside allocate and allocate_many: timed on its own too, but replayed only through them
    clock = time.process_time_ns
    for name in (*CALLS, *ONE_BLOCK) if log is not None else CALLS:
        call, blocks, total = getattr(pool_class, name), CALLS.get(name), sums.get(name)

        def wrapper(self, *args, _call=call, _name=name, _blocks=blocks, _total=total):
            if log is not None and not depth[0] and self.device == "gpu":
                log.append((_name, tuple(list(a) if isinstance(a, (list, tuple)) else a for a in args)))
            depth[0] += 1
            start = clock()
            try:
                return _call(self, *args)
            finally:
                if _total is not None:
                    _total[0] += clock() - start
                    _total[1] += _blocks(args[0])
                depth[0] -= 1

        setattr(pool_class, name, wrapper)
    return sums


def per_block(sums: dict[str, list[int]]) -> dict[str, dict]:
    return {
        name: {"cpu_s": round(ns / 1e9, 3), "blocks": n, "ns_a_block": round(ns / n) if n else None}
        for name, (ns, n) in sums.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=WORKLOADS, default="long-context")
    parser.add_argument("-n", "--num-requests", type=bounded(int, 1, 10**7), default=3000)
    args = parser.parse_args()

    from kvsched.allocators import block_pool
    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.executors.simulated import SimulatedExecutor
    from kvsched.workloads import build_workload

    pool_class = block_pool.BlockPool
    own = {name: vars(pool_class)[name] for name in (*CALLS, *ONE_BLOCK)}
    log: list[tuple[str, tuple]] = []
    in_run = timed(pool_class, log)
    engine = Engine(EngineConfig(**SETTINGS), "vllm-v1", SimulatedExecutor("llama2-7b-a100"), retain_finished=False)
    start = time.process_time()
    engine.run(islice(build_workload(args.workload).iter_requests(), args.num_requests), in_order=True)
    run_cpu = time.process_time() - start
    result = {"workload": args.workload, "requests": args.num_requests, "pool_module": block_pool.__file__}
    result |= {"cpu_s": round(run_cpu, 2), "in_run": per_block(in_run)}

    for name, call in own.items():
        setattr(pool_class, name, call)
    alone = timed(pool_class, None)
    gpu = engine.scheduler.block_manager.gpu
    pool = pool_class("gpu", gpu.num_blocks, gpu.keep_duplicates)
    for name, call_args in log:
        getattr(pool, name)(*call_args)
    result["alone"] = per_block(alone)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
