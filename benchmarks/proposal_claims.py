"""The ordering proposals (issue 23) against vllm-v1's FCFS on the real traces: TTFT, throughput, goodput.

Each policy runs on vLLM V1's rules with the Llama-2-7B/A100 profile and engine settings of
``sim_speed.A100_CONFIG``: the first ``--requests`` of the Azure conversation trace at ``--azure-scale``
times its rate, and as many ShareGPT requests (real lengths) at ``--sharegpt-rate`` req/s, Poisson.
Prints a Markdown table per workload (deltas against vllm-v1) and writes the rows as CSV.

    .venv/bin/python benchmarks/proposal_claims.py --out docs/figures/proposal-claims.csv
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recompute_tax import write_rows  # noqa: E402
from sim_speed import A100_CONFIG  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
POLICIES = {
    name: f"{REPO}/policies/{module}.py:{cls}"
    for name, module, cls in (
        ("residual-sjf", "residual_sjf", "ResidualSjf"),
        ("sjf-aging", "sjf_aging", "SjfAging"),
        ("hrrn", "hrrn", "Hrrn"),
        ("ewsjf", "ewsjf", "Ewsjf"),
        ("lcf", "lcf", "Lcf"),
    )
}
POLICIES = {"vllm-v1": "vllm-v1", **POLICIES}


def one(
    workload: str,
    policy: str,
    requests: int,
    azure_scale: float,
    sharegpt_rate: float,
    slo_ttft: float,
    slo_tpot: float,
) -> dict:
    from kvsched.core.config import EngineConfig
    from kvsched.experiments.simulation import SimJob
    from kvsched.workloads import build_workload

    load = (
        build_workload("azure-conv", rate_scale=azure_scale, num_requests=requests)
        if workload == "azure-conv"
        else build_workload("sharegpt", rate=sharegpt_rate, num_requests=requests)
    )
    s = (
        SimJob(
            load,
            POLICIES[policy],
            EngineConfig(**A100_CONFIG),
            slo_ttft=slo_ttft,
            slo_tpot=slo_tpot,
            record_timeseries=False,
        )
        .run()
        .summary
    )
    return {
        "workload": workload,
        "policy": policy,
        "finished": s["finished"],
        **{f"ttft_{k}_s": round(s["ttft_s"][k], 3) for k in ("mean", "p50", "p90", "p99")},
        "e2e_mean_s": round(s["e2e_s"]["mean"], 3),
        "tokens_per_s": round(s["throughput_tokens_per_s"], 1),
        "goodput_req_s": round(s["slo"]["goodput_requests_per_s"], 3),
        "slo_attainment": round(s["slo"]["slo_attainment"], 3),
        "preemptions": s["preemptions"]["recompute"],
        "tax_pct": round(100 * s["recompute"]["tax"], 2),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--azure-scale", type=float, default=1.5)
    parser.add_argument("--sharegpt-rate", type=float, default=1.5)
    parser.add_argument("--slo-ttft", type=float, default=2.0)
    parser.add_argument("--slo-tpot", type=float, default=0.1)
    parser.add_argument("--workloads", default="azure-conv,sharegpt")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    jobs = [
        (w, p, args.requests, args.azure_scale, args.sharegpt_rate, args.slo_ttft, args.slo_tpot)
        for w in args.workloads.split(",")
        for p in POLICIES
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one, *zip(*jobs)))
    for workload in args.workloads.split(","):
        got = {r["policy"]: r for r in rows if r["workload"] == workload}
        base = got["vllm-v1"]
        where = f"x{args.azure_scale} rate" if workload == "azure-conv" else f"{args.sharegpt_rate} req/s Poisson"
        print(
            f"\n{workload}, first {args.requests} requests at {where}; SLO TTFT <= {args.slo_ttft} s, TPOT <= "
            f"{args.slo_tpot} s"
        )
        print("| policy | mean TTFT (s) | p90 TTFT | p99 TTFT | tokens/s | goodput (req/s) | preemptions | tax |")
        print("|---|---|---|---|---|---|---|---|")
        for name, r in got.items():

            def d(key, r=r):
                return (
                    f"{r[key]}"
                    if name == "vllm-v1" or not base[key]
                    else f"{r[key]} ({100 * (r[key] / base[key] - 1):+.0f} %)"
                )

            print(
                f"| {name} | {d('ttft_mean_s')} | {d('ttft_p90_s')} | {d('ttft_p99_s')} | {d('tokens_per_s')} | "
                f"{d('goodput_req_s')} | {r['preemptions']} | {r['tax_pct']} % |"
            )
    if args.out:
        write_rows(args.out, rows)


if __name__ == "__main__":
    sys.exit(main())
