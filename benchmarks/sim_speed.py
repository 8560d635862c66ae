"""How fast the simulator is: simulated requests per wall second and simulated-to-wall time.

Replays the built-in Azure conversation trace (19,366 requests) under ``vllm-default`` at its own
rate and at 2×, then a large synthetic run (1,000,000 requests by default), each in a fresh
engine on one core, and prints a Markdown table. The baseline, measured in the same run, is the
first Azure replay again with the decode lane off (sequence by sequence, ``decode_lane=False``);
the last lines give the lane's speed-up over it and the ratio to Vidur's ≈400 requests per
second on a machine like this one (Vidur 0.0.26 from PyPI: 8,192 requests in about 20 s; measured
for this project on a 2-core machine, not in this run). ``--cprofile`` instead profiles one Azure
replay and splits the time between the scheduler (policy + step builder + block manager),
the engine's bookkeeping, the executor's cost model and the observers. ``--decision-log`` then
replays the first Azure scale ``--pairs`` more times without and with the decision log written
(``metrics/decision_log.py``, as ``engine run --output`` writes it), alternating, and prints the
ratio of the fastest of each (the neighbours on a shared machine only ever slow a run down).

    .venv/bin/python benchmarks/sim_speed.py                 # Azure 1×, 2× and the 1M synthetic run
    .venv/bin/python benchmarks/sim_speed.py --synthetic 100000
    .venv/bin/python benchmarks/sim_speed.py --cprofile
    .venv/bin/python benchmarks/sim_speed.py --policy sarathi --synthetic 0
    .venv/bin/python benchmarks/sim_speed.py --synthetic 0 --no-baseline --scales 1 --decision-log
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

# Llama-2-7B fp16 on one A100-80GB as vLLM sizes it: ~110k KV tokens (7,000 blocks of 16), 4 GiB
# of swap (512 blocks), max_model_len 4096 and the matching token budget.
A100_CONFIG = dict(num_gpu_blocks=7000, num_cpu_blocks=512, max_num_batched_tokens=4096, max_model_len=4096)


VIDUR_REQ_PER_S = 400  # Vidur 0.0.26's simulated requests per wall second on a 2-core machine (not measured here)


def measure(label: str, workload, policy: str = "vllm-default", decode_lane: bool = True, decision_log: Path | None = None) -> dict:
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
    return {
        "run": label, "requests": len(requests), "steps": s["steps"], "simulated_s": s["duration_s"],
        "build_s": build_s, "wall_s": wall, "cpu_s": cpu,
        "requests_per_wall_s": len(requests) / wall, "steps_per_wall_s": s["steps"] / wall,
        "sim_to_wall": s["duration_s"] / wall, "ttft_p99_s": s["ttft_s"]["p99"], "finished": s["finished"],
        "ignored": s["ignored"], "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def table(rows: list[dict]) -> str:
    """Markdown; CPU columns too, because on a shared machine wall time measures the neighbours.
    Peak RSS is the process's peak so far (the runs share one process)."""
    head = ("| run | requests | steps | simulated | engine wall | engine CPU | req / wall s | req / CPU s | "
            "simulated : wall | simulated : CPU | workload build | peak RSS |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['requests']:,} | {r['steps']:,} | {r['simulated_s']:,.0f} s | {r['wall_s']:,.1f} s | "
            f"{r['cpu_s']:,.1f} s | {r['requests_per_wall_s']:,.0f} | {r['requests'] / r['cpu_s']:,.0f} | "
            f"{r['sim_to_wall']:,.0f}× | {r['simulated_s'] / r['cpu_s']:,.0f}× | {r['build_s']:.1f} s | {r['max_rss_mb']:,.0f} MB |"
        )
    return "\n".join(lines)


def split_profile(scale: float = 1.0, limit: int | None = None) -> str:
    """cProfile one Azure replay; attribute cumulative time to the parts of the step loop."""
    import cProfile
    import pstats

    from kvsched.core.config import EngineConfig
    from kvsched.experiments.simulation import run_simulation
    from kvsched.metrics.timeseries import TimeSeriesRecorder
    from kvsched.workloads import build_workload

    requests = build_workload("azure-conv", rate_scale=scale, num_requests=limit).requests()
    prof = cProfile.Profile()
    prof.enable()
    run_simulation(requests, "vllm-default", EngineConfig(**A100_CONFIG), on_step=TimeSeriesRecorder())
    prof.disable()
    stats = pstats.Stats(prof)
    cum = {}
    for (file, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        cum[(file.rsplit("/", 2)[-2:] and "/".join(file.rsplit("/", 2)[-2:]), name)] = ct
    total = sum(ct for (f, n), ct in cum.items() if n == "run" and f.endswith("core/engine.py"))
    parts = {
        "scheduler: Scheduler.schedule (policy hook, step builder, decode lane, block manager, commit)": ("core/scheduler.py", "schedule"),
        "executor: SimulatedExecutor.execute (cost model, tokens outside the lane)": ("executors/simulated.py", "execute"),
        "bookkeeping: Engine._apply (lane step, finishing, tokens outside the lane)": ("core/engine.py", "_apply"),
        "step features (computed once per step)": ("core/outputs.py", "features"),
        "observer: TimeSeriesRecorder": ("metrics/timeseries.py", "__call__"),
    }
    lines = [f"cProfile of one Azure conv replay ({len(requests):,} requests, ×{scale:g}); share of Engine.run:", "",
             "| part | share |", "|---|---:|"]
    for label, key in parts.items():
        lines.append(f"| {label} | {100 * cum.get(key, 0.0) / total:.0f}% |")
    buf = __import__("io").StringIO()
    stats.stream = buf
    stats.sort_stats("tottime").print_stats(12)
    return "\n".join(lines) + "\n\nTop functions by own time:\n```\n" + buf.getvalue().split("\n\n", 1)[-1].strip() + "\n```"


def main(argv: list[str] | None = None) -> list[dict]:
    from kvsched.workloads import Poisson, SyntheticSpec, build_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", type=int, default=1_000_000, help="requests in the synthetic run (0: skip it)")
    parser.add_argument("--rate", type=float, default=8.0, help="synthetic arrival rate (req/s)")
    parser.add_argument("--azure-limit", type=int, default=None, help="replay only the first N Azure requests")
    parser.add_argument("--scales", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--cprofile", action="store_true", help="profile one Azure replay instead")
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--policy", default="vllm-default", help="the policy of every run")
    parser.add_argument("--no-baseline", action="store_true", help="skip the sequence-by-sequence baseline replay")
    parser.add_argument("--decision-log", action="store_true", help="replay the first trace without and with the decision log, alternating")
    parser.add_argument("--pairs", type=int, default=3, help="off/on pairs for --decision-log")
    args = parser.parse_args(argv)

    if args.cprofile:
        print(split_profile(args.scales[0], args.azure_limit))
        return []
    rows = []
    for scale in args.scales:
        rows.append(measure(f"Azure conv ×{scale:g}", build_workload("azure-conv", rate_scale=scale, num_requests=args.azure_limit), args.policy))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    first = rows[0]
    if not args.no_baseline:
        scale = args.scales[0]
        rows.append(measure(f"Azure conv ×{scale:g}, decode lane off (baseline)",
                            build_workload("azure-conv", rate_scale=scale, num_requests=args.azure_limit), args.policy, decode_lane=False))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        base = rows[-1]
    if args.decision_log:
        import pyarrow.parquet  # noqa: F401 (loaded before any timed run, so that both sides have it)

        scale, pairs = args.scales[0], {False: [], True: []}
        azure = build_workload("azure-conv", rate_scale=scale, num_requests=args.azure_limit)
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.pairs):
                for on in (False, True):
                    pairs[on].append(measure(f"Azure conv ×{scale:g}, decision log {'on' if on else 'off'}", azure, args.policy,
                                             decision_log=Path(tmp) / "decisions.parquet" if on else None))
                    print(table(pairs[on][-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        best = {on: max(runs, key=lambda r: r["requests_per_wall_s"]) for on, runs in pairs.items()}
        rows += [best[False], best[True]]
    if args.synthetic:
        spec = SyntheticSpec(num_requests=args.synthetic, arrivals=Poisson(rate=args.rate))
        rows.append(measure(f"synthetic {args.synthetic:,} (Poisson {args.rate:g}/s)", spec, args.policy))
        print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(f"python {platform.python_version()} on {platform.machine()}, one process; policy {args.policy}; engine config {A100_CONFIG}\n")
    print(table(rows))
    if not args.no_baseline:
        assert (base["steps"], base["simulated_s"]) == (first["steps"], first["simulated_s"]), "the baseline simulated something else"
        print(f"\ndecode lane: {first['requests_per_wall_s'] / base['requests_per_wall_s']:.1f}× the sequence-by-sequence "
              f"rate on {first['run']} (same steps, same simulated time)")
    if args.decision_log:
        off, on = best[False], best[True]
        assert (on["steps"], on["simulated_s"]) == (off["steps"], off["simulated_s"]), "the log changed the run"
        cpu = min(r["cpu_s"] for r in pairs[False]) / min(r["cpu_s"] for r in pairs[True])
        print(f"\ndecision log on: {on['requests_per_wall_s'] / off['requests_per_wall_s']:.3f}× the speed with it off "
              f"(fastest of {args.pairs} alternating runs each; {cpu:.3f}× in CPU time)")
    for r in rows:
        print(f"{r['run']}: {r['requests_per_wall_s'] / VIDUR_REQ_PER_S:.1f}× Vidur's ≈{VIDUR_REQ_PER_S} req/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
