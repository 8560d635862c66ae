"""How fast the simulator is: simulated requests per wall second and simulated-to-wall time.

Replays the built-in Azure conversation trace (19,366 requests) under ``vllm-default`` at its own
rate and at 2×, then a large synthetic run (1,000,000 requests by default), each in a fresh
engine on one core, and prints a Markdown table. The baseline, measured in the same run, is the
first Azure replay again with the decode lane off (sequence by sequence, ``decode_lane=False``).
``--cprofile`` instead profiles one Azure replay and splits the time between the scheduler
(policy + step builder + block manager), the engine's bookkeeping, the executor's cost model and
the observers.

``--like-vidur`` compares with Vidur like for like (``LIKE_VIDUR``): the same trace with Vidur's
4,096-token prefill cut, 7,424 KV blocks (what Vidur's memory planner gives Llama-2-7B on an
A100-80GB), at most 128 sequences and 4,096 tokens a step, no swap space, vLLM-style scheduling
(``vllm-default`` here, Vidur's ``vllm`` replica scheduler there). Each side runs in its own
process, alternating over ``--rounds``, timing only its simulation loop. Vidur runs when its
checkout and interpreter are there (``benchmarks/vidur_setup.py``); otherwise the script says
so and prints the recorded figure it divides by, with its date, machine and command.
``--decision-log`` then replays the first Azure scale ``--pairs`` more times without and with the
decision log written (``metrics/decision_log.py``, as ``engine run --output`` writes it),
alternating, and prints the ratio of the fastest of each (the neighbours on a shared machine
only ever slow a run down).

    .venv/bin/python benchmarks/sim_speed.py                 # Azure 1×, 2× and the 1M synthetic run
    .venv/bin/python benchmarks/sim_speed.py --synthetic 100000
    .venv/bin/python benchmarks/sim_speed.py --cprofile
    .venv/bin/python benchmarks/sim_speed.py --policy sarathi --synthetic 0
    .venv/bin/python benchmarks/sim_speed.py --synthetic 0 --no-baseline --scales 1 --decision-log
    .venv/bin/python benchmarks/sim_speed.py --like-vidur --vidur ~/vidur    # Vidur beside us, 5 rounds
    .venv/bin/python benchmarks/sim_speed.py --fleet-of-one --rounds 5     # Engine.run against a one-replica fleet
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import bounded  # noqa: E402

# Llama-2-7B fp16 on one A100-80GB as vLLM sizes it: ~110k KV tokens (7,000 blocks of 16), 4 GiB
# of swap (512 blocks), max_model_len 4096 and the matching token budget.
A100_CONFIG = dict(num_gpu_blocks=7000, num_cpu_blocks=512, max_num_batched_tokens=4096, max_model_len=4096)

# Vidur's own set-up for Llama-2-7B on one A100-80GB (benchmarks/vidur_replay.py): its memory planner's
# 7,424 blocks of 16, no swap space, the vllm replica scheduler's batch cap and token budget.
LIKE_VIDUR = dict(
    num_gpu_blocks=7424, num_cpu_blocks=0, max_num_seqs=128, max_num_batched_tokens=4096, max_model_len=4096
)
VIDUR_MAX_TOKENS = 4096  # Vidur's trace replay cuts prompts so that prompt + output <= this
REPO = Path(__file__).resolve().parents[1]
# The figure divided by when Vidur cannot run here, as measured by this script's --like-vidur.
RECORDED_VIDUR = {
    "req_per_s": 1412,
    "steps_per_s": 4325,
    "req_per_cpu_s": 1413,
    "steps_per_cpu_s": 4326,
    "steps": 59307,
    "max_rss_mb": 456,
    "rounds": 7,
    "date": "2026-12-01",
    "machine": "2-core AMD EPYC VM (this project's machine type, quiet: load 0.7-0.9), Python 3.11",
    "command": "benchmarks/sim_speed.py --like-vidur --vidur CHECKOUT --rounds 7",
    "source": "microsoft/vidur @7d47513, timing-only attention profile from benchmarks/vidur_setup.py",
}


def measure(
    label: str, workload, policy: str = "vllm-default", decode_lane: bool = True, decision_log: Path | None = None
) -> dict:
    from kvsched.core.config import EngineConfig
    from kvsched.experiments.simulation import run_simulation
    from kvsched.metrics.decision_log import DecisionLog

    t0 = time.perf_counter()
    requests = workload.requests()
    build_s = time.perf_counter() - t0
    gc.collect()
    log = DecisionLog(decision_log) if decision_log is not None else None
    t1, c1 = time.perf_counter(), time.process_time()
    result = run_simulation(requests, policy, EngineConfig(**A100_CONFIG, decode_lane=decode_lane), on_step=log)
    if log is not None:
        log.close()  # the last row group and the rename: part of the cost
    wall, cpu = time.perf_counter() - t1, time.process_time() - c1
    s = result.summary
    simulated = len(requests) - s["ignored"]  # an ignored request is turned away at once: not simulated
    return {
        "run": label,
        "requests": simulated,
        "steps": s["steps"],
        "simulated_s": s["duration_s"],
        "build_s": build_s,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests_per_wall_s": simulated / wall,
        "steps_per_wall_s": s["steps"] / wall,
        "sim_to_wall": s["duration_s"] / wall,
        "ttft_p99_s": s["ttft_s"]["p99"],
        "finished": s["finished"],
        "ignored": s["ignored"],
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def table(rows: list[dict]) -> str:
    """Markdown; CPU columns too, because on a shared machine wall time measures the neighbours.
    Peak RSS is the process's peak so far (the runs share one process)."""
    head = (
        "| run | requests simulated | ignored | steps | simulated | engine wall | engine CPU | req / wall s | req / "
        "CPU s | simulated : wall | simulated : CPU | workload build | peak RSS "
        "|\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['requests']:,} | {r['ignored']:,} | {r['steps']:,} | {r['simulated_s']:,.0f} s | "
            f"{r['wall_s']:,.1f} s | {r['cpu_s']:,.1f} s | {r['requests_per_wall_s']:,.0f} | "
            f"{r['requests'] / r['cpu_s']:,.0f} | {r['sim_to_wall']:,.0f}× | {r['simulated_s'] / r['cpu_s']:,.0f}× | "
            f"{r['build_s']:.1f} s | {r['max_rss_mb']:,.0f} MB |"
        )
    return "\n".join(lines)


def split_profile(scale: float = 1.0, limit: int | None = None, like_vidur: bool = False) -> str:
    """cProfile one Azure replay (the like-Vidur one if asked); attribute cumulative time to the parts of the step
    loop."""
    import cProfile
    import pstats

    from kvsched.core.config import EngineConfig
    from kvsched.experiments.simulation import run_simulation
    from kvsched.metrics.timeseries import TimeSeriesRecorder
    from kvsched.workloads import build_workload

    cut = VIDUR_MAX_TOKENS if like_vidur else None
    requests = build_workload("azure-conv", rate_scale=scale, num_requests=limit, max_total_tokens=cut).requests()
    prof = cProfile.Profile()
    prof.enable()
    run_simulation(
        requests,
        "vllm-default",
        EngineConfig(**(LIKE_VIDUR if like_vidur else A100_CONFIG)),
        on_step=TimeSeriesRecorder(),
    )
    prof.disable()
    stats = pstats.Stats(prof)
    cum = {}
    for (file, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        cum[(file.rsplit("/", 2)[-2:] and "/".join(file.rsplit("/", 2)[-2:]), name)] = ct
    total = sum(ct for (f, n), ct in cum.items() if n == "run" and f.endswith("core/engine.py"))
    parts = {
        "steady runs: SteadyRuns.advance (repeats advanced at once, with their StepRun to the observer)": (
            "executors/steady_runs.py",
            "advance",
        ),
        "scheduler: Scheduler.schedule (policy hook, step builder, decode lane, block manager, commit)": (
            "core/scheduler.py",
            "schedule",
        ),
        "executor: SimulatedExecutor.execute (cost model, tokens outside the lane)": (
            "executors/simulated.py",
            "execute",
        ),
        "bookkeeping: Completion.apply (lane step, finishing, tokens outside the lane)": (
            "mechanics/completion.py",
            "apply",
        ),
        "step features (computed once per step)": ("core/outputs.py", "features"),
        "observer: TimeSeriesRecorder, single steps": ("metrics/timeseries.py", "__call__"),
        "observer: TimeSeriesRecorder, steady runs": ("metrics/timeseries.py", "on_steps"),
    }
    setup = "like Vidur" if like_vidur else "A100_CONFIG"
    lines = [
        f"cProfile of one Azure conv replay ({len(requests):,} requests, ×{scale:g}, {setup}); share of Engine.run:",
        "",
        "| part | share |",
        "|---|---:|",
    ]
    for label, key in parts.items():
        lines.append(f"| {label} | {100 * cum.get(key, 0.0) / total:.0f}% |")
    buf = __import__("io").StringIO()
    stats.stream = buf
    stats.sort_stats("tottime").print_stats(12)
    return (
        "\n".join(lines)
        + "\n\nTop functions by own time:\n```\n"
        + buf.getvalue().split("\n\n", 1)[-1].strip()
        + "\n```"
    )


def ours_like_vidur(policy: str, fleet_of_one: bool = False, records: bool = False) -> dict:
    """One like-Vidur replay in this process; only ``Engine.run`` (the simulation loop) is timed. ``fleet_of_one``:
    the same replay as a one-replica fleet behind ``round-robin`` (``Cluster.run``, its records included) instead;
    ``records``: as ``engine run`` runs it instead, its records included (``single_run.py``)."""
    from kvsched import Engine, EngineConfig, SimulatedExecutor
    from kvsched.core.sequence import SequenceStatus
    from kvsched.workloads import build_workload

    workload = build_workload("azure-conv", max_total_tokens=VIDUR_MAX_TOKENS)
    requests = workload.requests()
    if fleet_of_one:
        from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
        from kvsched.cluster.records import FIELDS

        group = ReplicaGroup(policy=policy, profile="llama2-7b-a100", settings=LIKE_VIDUR)
        cluster = Cluster(FleetSpec(replicas=[group], router="round-robin"))
        engine = cluster.replicas[0].engine
    else:
        engine = Engine(EngineConfig(**LIKE_VIDUR), policy, SimulatedExecutor("llama2-7b-a100"))
        run = engine.run
        if records:  # imported only here: the bare run's process is as it was
            from single_run import engine_run_loop

            run = engine_run_loop(engine)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    if fleet_of_one:
        rows = cluster.run(requests).rows
    else:
        ended = run(requests)  # the finished groups (Engine.run), or the records made of them
    loop_s, loop_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    ignore = SequenceStatus.FINISHED_IGNORED.name
    if fleet_of_one:
        status, steps = FIELDS.index("status"), cluster.replicas[0].steps
        ignored = sum(row[status] == ignore for row in rows)
    else:
        steps = engine.num_steps
        ignored = sum(getattr(x.status, "name", x.status) == ignore for x in ended)
    return {
        "requests": len(requests) - ignored,
        "ignored": ignored,
        "prompts_cut": workload.num_cut(),
        "steps": steps,
        "loop_s": loop_s,
        "loop_cpu_s": loop_cpu_s,
        "simulated_s": engine.now,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def fleet_of_one(rounds: int, policy: str) -> dict:
    """The like-Vidur replay by ``Engine.run`` (bare), as ``engine run`` runs it (its records made) and as a one-replica
    fleet behind a router, alternating over ``rounds`` in fresh processes: the loop's CPU seconds of each and the
    ratios (issue 33: a single engine as a fleet of one)."""
    sides: dict[str, list[float]] = {"engine": [], "engine + records": [], "fleet of one": []}
    flags = {"engine": [], "engine + records": ["--records"], "fleet of one": ["--fleet-of-one"]}
    for i in range(rounds):
        for name, flag in flags.items():
            run = _child([sys.executable, __file__, "--one-like-vidur", "--policy", policy, *flag])
            sides[name].append(run["loop_cpu_s"])
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.3f} CPU s" for k, v in sides.items()), file=sys.stderr)
    engine, logged, fleet = sides["engine"], sides["engine + records"], sides["fleet of one"]
    result = {
        "engine_cpu_s": statistics.median(engine),
        "engine_records_cpu_s": statistics.median(logged),
        "fleet_cpu_s": statistics.median(fleet),
        "ratio_median": statistics.median(fleet) / statistics.median(engine),
        "ratio_fastest": min(fleet) / min(engine),
        "ratio_to_records_median": statistics.median(fleet) / statistics.median(logged),
        "rounds": rounds,
    }
    print(json.dumps(result))
    return result


def _child(cmd: list[str], **kwargs) -> dict:
    """Run one side in its own process; its last output line that is a JSON object is its result (Vidur logs after
    it)."""
    done = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    r = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    r["req_per_s"], r["steps_per_s"] = r["requests"] / r["loop_s"], r["steps"] / r["loop_s"]
    r["req_per_cpu_s"], r["steps_per_cpu_s"] = r["requests"] / r["loop_cpu_s"], r["steps"] / r["loop_cpu_s"]
    return r


def vidur_missing(vidur: Path | None, python: Path) -> str | None:
    """Why Vidur cannot run here, or None."""
    if vidur is None:
        return "no Vidur checkout given (--vidur PATH or $VIDUR_SRC)"
    if not (vidur / "vidur" / "simulator.py").exists():
        return f"{vidur} is not a Vidur checkout"
    if not python.exists():
        return f"no Vidur interpreter at {python} (benchmarks/vidur_setup.py makes it)"
    if not (vidur / "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv").exists():
        return "the checkout has no attention profile for Llama-2-7B/A100 (benchmarks/vidur_setup.py writes one)"
    return None


def like_vidur(rounds: int, policy: str, vidur: Path | None, vidur_python: Path) -> dict:
    """Both sides alternating over ``rounds``, each run in a fresh process; prints the table and ratios."""
    why_not = vidur_missing(vidur, vidur_python)
    ours, theirs = [], []
    for i in range(rounds):
        ours.append(_child([sys.executable, __file__, "--one-like-vidur", "--policy", policy]))
        line = f"round {i + 1}: kvsched {ours[-1]['req_per_s']:,.0f} req/s"
        if why_not is None:
            theirs.append(
                _child(
                    [str(vidur_python), str(REPO / "benchmarks" / "vidur_replay.py")],
                    cwd=vidur,
                    env={**os.environ, "WANDB_MODE": "disabled"},
                )
            )
            line += f", Vidur {theirs[-1]['req_per_s']:,.0f} req/s"
        print(line, file=sys.stderr, flush=True)

    def median(rows, key):
        return statistics.median(r[key] for r in rows)

    o = ours[0]
    print(
        f"Azure conv, like Vidur: {o['requests'] + o['ignored']:,} requests ({o['prompts_cut']:,} prompts cut to "
        f"prompt + output <= {VIDUR_MAX_TOKENS:,}), engine config {LIKE_VIDUR}, policy {policy}, profile "
        f"llama2-7b-a100; python {platform.python_version()}, each run in its own process; medians of {rounds} rounds; "
        "CPU = the process's CPU time in the loop (on a shared machine, wall time also measures the neighbours)\n"
    )
    print(
        "| | requests simulated | ignored | steps | simulated | loop wall | loop CPU | req / wall s | steps / wall s "
        "| req / CPU s | steps / CPU s | peak RSS |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sides = [("kvsched", ours)] + (
        [("Vidur (microsoft/vidur @7d47513, measured in this run)", theirs)] if theirs else []
    )
    for name, rows in sides:
        r = rows[0]
        print(
            f"| {name} | {r['requests']:,} | {r.get('ignored', 0):,} | {r['steps']:,} | {r['simulated_s']:,.0f} s | "
            f"{median(rows, 'loop_s'):.2f} s | {median(rows, 'loop_cpu_s'):.2f} s | {median(rows, 'req_per_s'):,.0f} | "
            f"{median(rows, 'steps_per_s'):,.0f} | {median(rows, 'req_per_cpu_s'):,.0f} | "
            f"{median(rows, 'steps_per_cpu_s'):,.0f} | {max(x['max_rss_mb'] for x in rows):,.0f} MB |"
        )
    result = {"ours": ours, "vidur": theirs}
    pairs = (
        ("req_per_s", "requests / wall s"),
        ("steps_per_s", "steps / wall s"),
        ("req_per_cpu_s", "requests / CPU s"),
        ("steps_per_cpu_s", "steps / CPU s"),
    )
    if theirs:
        print()
        for key, label in pairs:
            per_round = [a[key] / b[key] for a, b in zip(ours, theirs)]
            result[key] = statistics.median(per_round)
            print(
                f"same run, {label}: kvsched {statistics.median(per_round):.1f}× Vidur "
                f"(median of {rounds} alternating rounds; {min(per_round):.1f}–{max(per_round):.1f}× over rounds)"
            )
        return result
    rec = RECORDED_VIDUR
    print(
        f"\nVidur not run here: {why_not}. Dividing by the RECORDED Vidur figures (medians of {rec['rounds']} rounds, "
        f"{rec['steps']:,} steps, {rec['max_rss_mb']:,.0f} MB), recorded {rec['date']} on a {rec['machine']} with "
        f"`{rec['command']}` ({rec['source']}):"
    )
    for key, label in pairs:
        result[key] = median(ours, key) / rec[key]
        print(f"RECORDED Vidur {rec[key]:,.0f} {label}: kvsched {result[key]:.1f}× Vidur")
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    from kvsched.workloads import Poisson, SyntheticSpec, build_workload
    from kvsched.workloads.arrivals import MAX_RATE, MIN_RATE
    from kvsched.workloads.errors import MAX_REQUESTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--synthetic",
        type=bounded(int, 0, MAX_REQUESTS),
        default=1_000_000,
        help="requests in the synthetic run (0: skip it)",
    )
    parser.add_argument(
        "--rate", type=bounded(float, MIN_RATE, MAX_RATE), default=8.0, help="synthetic arrival rate (req/s)"
    )
    parser.add_argument(
        "--azure-limit", type=bounded(int, 1, MAX_REQUESTS), default=None, help="replay only the first N Azure requests"
    )
    parser.add_argument("--scales", type=bounded(float, 1e-3, 1e3), nargs="+", default=[1.0, 2.0])
    parser.add_argument("--cprofile", action="store_true", help="profile one Azure replay instead")
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--policy", default="vllm-default", help="the policy of every run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the sequence-by-sequence baseline replay")
    parser.add_argument(
        "--decision-log",
        action="store_true",
        help="replay the first trace without and with the decision log, alternating",
    )
    parser.add_argument("--pairs", type=bounded(int, 1, 100), default=3, help="off/on pairs for --decision-log")
    parser.add_argument("--like-vidur", action="store_true", help="the like-for-like comparison with Vidur instead")
    parser.add_argument("--rounds", type=bounded(int, 1, 100), default=5, help="--like-vidur: alternating rounds")
    parser.add_argument(
        "--vidur", type=Path, default=os.environ.get("VIDUR_SRC"), help="--like-vidur: a microsoft/vidur checkout"
    )
    parser.add_argument(
        "--vidur-python", type=Path, default=REPO / ".venv-vidur" / "bin" / "python", help="Vidur's interpreter"
    )
    parser.add_argument(
        "--one-like-vidur", action="store_true", help=argparse.SUPPRESS
    )  # one of our rounds, in a child process
    parser.add_argument("--records", action="store_true", help=argparse.SUPPRESS)  # the child's engine records too
    parser.add_argument(
        "--fleet-of-one",
        action="store_true",
        help="the like-Vidur replay by Engine.run against a one-replica fleet, alternating over --rounds",
    )
    args = parser.parse_args(argv)

    if args.one_like_vidur:
        print(json.dumps(ours_like_vidur(args.policy, args.fleet_of_one, args.records)))
        return []
    if args.fleet_of_one:
        fleet_of_one(args.rounds, args.policy)
        return []
    if args.cprofile:
        print(split_profile(args.scales[0], args.azure_limit, args.like_vidur))
        return []
    if args.like_vidur:
        like_vidur(args.rounds, args.policy, args.vidur, args.vidur_python)
        return []
    rows = []
    for scale in args.scales:
        rows.append(
            measure(
                f"Azure conv ×{scale:g}",
                build_workload("azure-conv", rate_scale=scale, num_requests=args.azure_limit),
                args.policy,
            )
        )
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    first = rows[0]
    if not args.no_baseline:
        scale = args.scales[0]
        rows.append(
            measure(
                f"Azure conv ×{scale:g}, decode lane off (baseline)",
                build_workload("azure-conv", rate_scale=scale, num_requests=args.azure_limit),
                args.policy,
                decode_lane=False,
            )
        )
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        base = rows[-1]
    if args.decision_log:
        import pyarrow.parquet  # noqa: F401 (loaded before any timed run, so that both sides have it)

        scale, pairs = args.scales[0], {False: [], True: []}
        azure = build_workload("azure-conv", rate_scale=scale, num_requests=args.azure_limit)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.pairs):
                for on in (False, True):
                    pairs[on].append(
                        measure(
                            f"Azure conv ×{scale:g}, decision log {'on' if on else 'off'}",
                            azure,
                            args.policy,
                            decision_log=Path(tmp) / "decisions.parquet" if on else None,
                        )
                    )
                    print(table(pairs[on][-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        best = {on: max(runs, key=lambda r: r["requests_per_wall_s"]) for on, runs in pairs.items()}
        rows += [best[False], best[True]]
    if args.synthetic:
        spec = SyntheticSpec(num_requests=args.synthetic, arrivals=Poisson(rate=args.rate))
        rows.append(measure(f"synthetic {args.synthetic:,} (Poisson {args.rate:g}/s)", spec, args.policy))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(
        f"python {platform.python_version()} on {platform.machine()}, one process; policy {args.policy}; engine config "
        f"{A100_CONFIG}\n"
    )
    print(table(rows))
    if not args.no_baseline:
        assert (base["steps"], base["simulated_s"]) == (first["steps"], first["simulated_s"]), (
            "the baseline simulated something else"
        )
        print(
            f"\ndecode lane: {(first['requests'] / first['cpu_s']) / (base['requests'] / base['cpu_s']):.1f}× the "
            f"sequence-by-sequence rate per CPU second on {first['run']} (same steps, same simulated time)"
        )
    if args.decision_log:
        off, on = best[False], best[True]
        assert (on["steps"], on["simulated_s"]) == (off["steps"], off["simulated_s"]), "the log changed the run"
        cpu = min(r["cpu_s"] for r in pairs[False]) / min(r["cpu_s"] for r in pairs[True])
        print(
            f"\ndecision log on: {on['requests_per_wall_s'] / off['requests_per_wall_s']:.3f}× the speed with it off "
            f"(fastest of {args.pairs} alternating runs each; {cpu:.3f}× in CPU time)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
