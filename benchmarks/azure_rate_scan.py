"""The Azure conversation trace under vllm-default at several rate scales: where one A100 saturates.

Runs the whole built-in trace (19,366 requests) once per scale, in parallel processes, on the
Llama-2-7B/A100 profile and engine settings of ``sim_speed.A100_CONFIG``, and writes for
``docs/simulation.md``: a Markdown table, the saturation curve, overlaid TTFT/TPOT CDFs and
queue/KV-usage plots for two scales.

    .venv/bin/python benchmarks/azure_rate_scan.py --out docs/figures
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_speed import A100_CONFIG  # noqa: E402

SCALES = (0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0)
DETAIL = (0.75, 2.0)  # scales that get queue/KV plots


def one(scale: float, limit: int | None, slo_ttft: float, slo_tpot: float):
    from kvsched.core.config import EngineConfig
    from kvsched.experiments.simulation import SimJob
    from kvsched.reporting.files import requests_frame
    from kvsched.workloads import build_workload

    job = SimJob(
        build_workload("azure-conv", rate_scale=scale, num_requests=limit),
        "vllm-default",
        EngineConfig(**A100_CONFIG),
        slo_ttft=slo_ttft,
        slo_tpot=slo_tpot,
    )
    outcome = job.run()
    return (
        scale,
        outcome.summary,
        requests_frame(outcome.result.requests),
        outcome.timeseries.frame(),
        outcome.simulate_s,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/figures"))
    parser.add_argument("--limit", type=int, default=None, help="first N requests only (quick look)")
    parser.add_argument("--scales", type=float, nargs="+", default=list(SCALES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--slo-tpot", type=float, default=0.1)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    with ProcessPoolExecutor(args.workers) as pool:
        results = sorted(
            pool.map(one, args.scales, *zip(*[(args.limit, args.slo_ttft, args.slo_tpot)] * len(args.scales)))
        )

    from kvsched.reporting.plots import pyplot, queues_and_kv

    rows = []
    print(
        "| rate scale | offered req/s | served req/s | output tok/s | TTFT p50 / p99 (s) | TPOT mean / p99 (ms) | "
        "queueing p99 (s) | peak waiting | mean GPU KV use | preemptions | ignored | SLO attainment (TTFT ≤ "
        f"{args.slo_ttft:g} s, TPOT ≤ {1000 * args.slo_tpot:g} ms) | wall |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for scale, s, req, ts, wall in results:
        span = req.arrival_time.max() - req.arrival_time.min()
        offered = len(req) / span if span > 0 else float("nan")
        kv = s["kv_usage"]
        rows.append((scale, offered, s))
        print(
            f"| ×{scale:g} | {offered:.2f} | {s['requests_per_s']:.2f} | {s['throughput_tokens_per_s']:,.0f} | "
            f"{s['ttft_s']['p50']:.2f} / {s['ttft_s']['p99']:.1f} | {1000 * s['tpot_s']['mean']:.1f} / "
            f"{1000 * s['tpot_s']['p99']:.1f} | {s['queueing_s']['p99']:.1f} | {kv['waiting_peak']:,} | "
            f"{100 * kv['gpu_utilization_mean']:.0f}% | {s['preemptions']['recompute']} R / {s['preemptions']['swap']} "
            f"S | {s['ignored']} | {100 * s['slo']['slo_attainment']:.0f}% | {wall:.0f} s |"
        )
        if scale in DETAIL:
            queues_and_kv(ts, s, args.out / f"azure_x{scale:g}_queues_kv.png")

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    offered = [o for _, o, _ in rows]
    a.plot(offered, [s["requests_per_s"] for _, _, s in rows], "o-", label="served")
    a.plot(offered, offered, ":", color="grey", label="offered")
    a.set(xlabel="offered load (req/s)", ylabel="requests/s", title="throughput")
    b.plot(offered, [s["ttft_s"]["p50"] for _, _, s in rows], "o-", label="TTFT p50")
    b.plot(offered, [s["ttft_s"]["p99"] for _, _, s in rows], "s-", label="TTFT p99")
    b.set(xlabel="offered load (req/s)", ylabel="seconds", yscale="log", title="time to first token")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for scale, o, s in rows:
        a.annotate(f"×{scale:g}", (o, s["requests_per_s"]), fontsize=7, xytext=(3, -10), textcoords="offset points")
    fig.suptitle("Azure conv trace · vllm-default · llama2-7b-a100", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out / "azure_saturation.png", dpi=90)
    plt.close(fig)

    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for scale, _s, req, _ts, _w in results:
        done = req[req.status.isin(["FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"])]
        for ax, col, mult in ((a, "ttft", 1), (b, "tpot", 1000)):
            v = np.sort(done[col].dropna().to_numpy() * mult)
            ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=f"×{scale:g}", lw=1)
    a.set(xscale="log", xlabel="TTFT (s)", ylabel="share of requests", title="TTFT CDF")
    b.set(xscale="log", xlabel="TPOT (ms)", title="TPOT CDF")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Azure conv trace · vllm-default · llama2-7b-a100, by rate scale", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out / "azure_latency_cdfs.png", dpi=90)
    plt.close(fig)
    print(
        f"\nwrote {args.out}/azure_saturation.png, azure_latency_cdfs.png, "
        + ", ".join(f"azure_x{s:g}_queues_kv.png" for s in DETAIL if s in args.scales)
    )


if __name__ == "__main__":
    main(sys.argv[1:])
