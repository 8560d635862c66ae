"""Instructions a shortened like-Vidur ``Engine.run`` costs, counted by callgrind: a figure the machine's load does not
move (issue 33's speed check, ``sim_speed.py --one-like-vidur``, on its first ``-n`` requests).

Only the run is counted: it is called inside ``functools.reduce`` (which nothing in the loop calls), and callgrind
collects from that function's entry to its exit (``--toggle-collect``), so imports and the workload's build are left
out. A code is a commit (unpacked and its C extensions built, as ``commits_speed.py`` does) or a folder holding
``kvsched`` (put first on ``PYTHONPATH``), run in a fresh process with its string hashes fixed. Counts of one code
vary by about 0.25 % from run to run (dict layouts follow object addresses).

``--cache`` simulates the caches too (about twice as slow) and counts the first level's misses: the instruction cache's
(the interpreter's C code a run goes through) and the data cache's (objects, bytecode). Each costs some ten cycles
that instructions do not show, so two codes of the same instructions may differ in CPU seconds by their misses.

``--fleet R`` counts ``cluster_speed.py``'s fleet instead (``vllm-dp`` over R replicas of ``vllm-default``, 50 ms
stale, Poisson arrivals at 4 requests/s a replica): ``Cluster.run`` on its first ``-n`` requests. ``--fleet-of-one``
counts the like-Vidur replay as a one-replica fleet behind ``round-robin`` (``sim_speed.py --fleet-of-one``'s), and
``--records`` the replay as ``engine run`` runs it, records included (``benchmarks/single_run.py``: the fleet of one
with no router, or on a code from before that was the single run, ``Engine.run`` with a ``RequestLog``).

    .venv/bin/python benchmarks/run_instructions.py 0b64e72 main HEAD -n 300
    .venv/bin/python benchmarks/run_instructions.py 0b64e72 HEAD -n 300 --cache
    .venv/bin/python benchmarks/run_instructions.py 0b64e72 HEAD -n 2000 --fleet 16
    .venv/bin/python benchmarks/run_instructions.py HEAD -n 1000 --records; ... HEAD -n 1000 --fleet-of-one
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import bounded  # noqa: E402
from commits_speed import code_folders  # noqa: E402
from single_run import engine_run_loop  # noqa: E402


def inner(n: int, fleet: int = 0, side: str = "engine") -> None:
    """The first ``n`` requests of the like-Vidur replay through ``Engine.run``, in this process (``side``
    ``records``: as ``engine run`` runs it, records included; ``fleet-of-one``: through a one-replica fleet behind
    ``round-robin``);
    ``fleet``: instead ``n`` requests of ``cluster_speed.py``'s workload through a fleet of that many replicas."""
    import functools
    import gc

    import kvsched

    if fleet:
        from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
        from kvsched.workloads.arrivals import Poisson
        from kvsched.workloads.synthetic import SyntheticSpec

        spec = FleetSpec(replicas=[ReplicaGroup(count=fleet)], router="vllm-dp", staleness_s=0.05)
        cluster = Cluster(spec)
        arrivals = SyntheticSpec(num_requests=n, arrivals=Poisson(rate=4.0 * fleet), seed=0).iter_requests()
        requests = list(arrivals)
        gc.collect()
        functools.reduce(lambda _, __: cluster.run(requests), [0, 1])  # callgrind collects inside reduce only
        print(f"steps {sum(r.steps for r in cluster.replicas)}", file=sys.stderr)
        return

    sys.path.insert(0, str(Path(kvsched.__file__).parent / "benchmarks"))  # that code's own settings
    import sim_speed

    from kvsched import Engine, EngineConfig, SimulatedExecutor
    from kvsched.workloads import build_workload

    requests = build_workload("azure-conv", max_total_tokens=sim_speed.VIDUR_MAX_TOKENS).requests()[:n]
    if side == "fleet-of-one":
        from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup

        group = ReplicaGroup(policy="vllm-default", profile="llama2-7b-a100", settings=sim_speed.LIKE_VIDUR)
        cluster = Cluster(FleetSpec(replicas=[group], router="round-robin"))
        gc.collect()
        functools.reduce(lambda _, __: cluster.run(requests), [0, 1])
        print(f"steps {cluster.replicas[0].steps}", file=sys.stderr)
        return
    engine = Engine(EngineConfig(**sim_speed.LIKE_VIDUR), "vllm-default", SimulatedExecutor("llama2-7b-a100"))
    run = functools.partial(engine.run, requests)
    if side == "records":  # as engine run runs it, on this code (benchmarks/single_run.py, this checkout's)
        run = functools.partial(engine_run_loop(engine), requests)
    gc.collect()
    functools.reduce(lambda _, __: run(), [0, 1])  # callgrind collects inside reduce only
    print(f"steps {engine.num_steps}", file=sys.stderr)


def instructions(
    folder: Path, n: int, cache: bool = False, fleet: int = 0, side: str = "engine"
) -> tuple[dict[str, int], int]:
    """What callgrind counts for ``inner(n, fleet, side)`` on the code in ``folder`` (the parent of its ``kvsched``), by
    event (``Ir``, and with ``cache`` the misses ``I1mr``, ``D1mr``, ``D1mw``...), and the steps it ran."""
    env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONHASHSEED": "0"}
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--collect-atstart=no"]
    command += ["--cache-sim=yes"] if cache else []
    command += ["--toggle-collect=functools_reduce", sys.executable, __file__, "--inner", str(n), str(fleet), side]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    events, found = re.search(r"Events +: ([\w ]+)", done.stderr), re.search(r"Collected : ([\d ]+)", done.stderr)
    steps = re.search(r"^steps (\d+)", done.stderr, re.M)
    if done.returncode or events is None or found is None or steps is None:
        raise SystemExit(f"{folder}: callgrind failed ({done.returncode}): {done.stderr[-1000:]}")
    return dict(zip(events.group(1).split(), map(int, found.group(1).split()), strict=True)), int(steps.group(1))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--inner"]:
        inner(int(argv[1]), int(argv[2]), argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codes", nargs="+", help="commits or folders holding kvsched; the first is the baseline")
    parser.add_argument(
        "-n", type=bounded(int, 1, 10_000_000), default=300, help="requests of the replay (19,366 in all)"
    )
    parser.add_argument("--cache", action="store_true", help="count first-level cache misses too")
    sides = parser.add_mutually_exclusive_group()  # one run counted: a side of the replay, or the fleet instead
    sides.add_argument(
        "--fleet",
        type=bounded(int, 1, 100_000),
        default=0,
        metavar="R",
        help="count cluster_speed.py's fleet of R replicas instead",
    )
    sides.add_argument("--records", action="store_true", help="the replay as engine run runs it, records included")
    sides.add_argument(
        "--fleet-of-one", action="store_true", help="the replay as a one-replica fleet behind round-robin"
    )
    args = parser.parse_args(argv)
    side = "records" if args.records else "fleet-of-one" if args.fleet_of_one else "engine"
    misses = {"I1mr": "instruction-cache misses", "D1": "data-cache misses (reads and writes)"} if args.cache else {}
    with tempfile.TemporaryDirectory(prefix="kvsched-run-instructions-") as tmp:
        folders = code_folders(args.codes, Path(tmp), build=True)
        columns = "".join(f" {what} | ratio |" for what in misses.values())
        loops = {
            "engine": "Engine.run",
            "records": "engine run's loop and records",
            "fleet-of-one": "Cluster.run (1 replica)",
        }
        loop = f"Cluster.run ({args.fleet} replicas)" if args.fleet else loops[side]
        print(f"| code ({args.n} requests) | steps | instructions of {loop} | per step | ratio |{columns}")
        print("|---|---:|---:|---:|---:|" + "---:|---:|" * len(misses))
        base = None
        for name, folder in folders.items():
            counts, steps = instructions(folder, args.n, args.cache, args.fleet, side)
            counts["D1"] = counts.get("D1mr", 0) + counts.get("D1mw", 0)
            base = base or counts
            cells = "".join(f" {counts[e]:,} | {counts[e] / base[e]:.3f} |" for e in misses)
            count = counts["Ir"]
            print(
                f"| {name} | {steps:,} | {count:,} | {count / steps:,.0f} | {count / base['Ir']:.3f} |{cells}",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])
