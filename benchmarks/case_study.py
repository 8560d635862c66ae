"""The first seed article's case study (§5), reproduced: ``python benchmarks/case_study.py``.

An AI writing assistant, short prompts and long generations, users sensitive to time to first
token. Three configurations on the same requests (same seed):

  A  delay_factor 2.0, max_num_batched_tokens 2048, vllm-default      (the starting point)
  B  delay_factor 0.5, max_num_batched_tokens 512,  vllm-default      (the "eager" attempt)
  C  delay_factor 1.0, max_num_batched_tokens 2048, priority-vip      (the final balance; VIP share)

It prints the table (p99 TTFT for all and for VIP requests, throughput, change vs A), writes
the CDF plot, and rewrites the results block of docs/case-study.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvsched.core.config import EngineConfig
from kvsched.experiments.simulation import SimJob
from kvsched.workloads.arrivals import Poisson
from kvsched.workloads.distributions import LogNormal
from kvsched.workloads.synthetic import SyntheticSpec

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "case-study.md"
PLOT = ROOT / "docs" / "case-study.png"
START, END = "<!-- results:start -->", "<!-- results:end -->"

CONFIGS = (
    ("A", "delay 2.0, budget 2048", "vllm-default", {"delay_factor": 2.0, "max_num_batched_tokens": 2048}),
    ("B", "delay 0.5, budget 512", "vllm-default", {"delay_factor": 0.5, "max_num_batched_tokens": 512}),
    (
        "C",
        "delay 1.0, budget 2048, priority-vip",
        "priority-vip",
        {"delay_factor": 1.0, "max_num_batched_tokens": 2048},
    ),
)


def workload(num_requests: int, rate: float, vip_share: float, seed: int) -> SyntheticSpec:
    """Short prompts, long generations; a share of requests from the ``vip`` tenant."""
    return SyntheticSpec(
        num_requests=num_requests,
        arrivals=Poisson(rate=rate),
        prompt=LogNormal(median=96, sigma=0.6, max=480),
        output=LogNormal(median=320, sigma=0.5, max=1024),
        tenants={"vip": vip_share, "default": 1.0 - vip_share},
        seed=seed,
    )


def p99(values: list[float]) -> float:
    from kvsched.metrics.requests import percentile

    return percentile(sorted(values), 99)


def run(num_requests: int, rate: float, vip_share: float, seed: int, blocks: int) -> list[dict]:
    rows = []
    spec = workload(num_requests, rate, vip_share, seed)
    for key, label, policy, knobs in CONFIGS:
        config = EngineConfig(num_gpu_blocks=blocks, max_model_len=2048, **knobs)
        outcome = SimJob(spec, policy, config, record_timeseries=False).run()
        done = [r for r in outcome.result.requests if r.ttft is not None]
        rows.append(
            {
                "key": key,
                "label": label,
                "policy": policy,
                "ttft_p99": p99([r.ttft for r in done]),
                "ttft_p99_vip": p99([r.ttft for r in done if r.tenant == "vip"]),
                "ttft_p50": outcome.summary["ttft_s"]["p50"],
                "tpot_p50_ms": 1000 * outcome.summary["tpot_s"]["p50"],
                "tok_s": outcome.summary["throughput_tokens_per_s"],
                "finished": outcome.summary["finished"],
                "ttfts": [r.ttft for r in done],
                "vip_ttfts": [r.ttft for r in done if r.tenant == "vip"],
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    base = rows[0]

    def change(row, key):
        return "—" if row is base else f"{100 * (row[key] / base[key] - 1):+.0f}%"

    lines = [
        "| config | policy | p99 TTFT all (s) | Δ | p99 TTFT VIP (s) | Δ | p50 TTFT (s) | p50 TPOT (ms) | throughput "
        "(tok/s) | Δ |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['key']}: {r['label']} | {r['policy']} | {r['ttft_p99']:.2f} | {change(r, 'ttft_p99')} | "
            f"{r['ttft_p99_vip']:.2f} | {change(r, 'ttft_p99_vip')} | {r['ttft_p50']:.2f} | {r['tpot_p50_ms']:.1f} | "
            f"{r['tok_s']:.0f} | {change(r, 'tok_s')} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((axes[0], "ttfts", "TTFT, all requests"), (axes[1], "vip_ttfts", "TTFT, VIP requests")):
        for r in rows:
            v = sorted(r[key])
            ax.step(v, [(i + 1) / len(v) for i in range(len(v))], where="post", label=f"{r['key']}: {r['label']}")
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1500)
    parser.add_argument("--rates", default="6,8,12", help="mean arrivals per second (Poisson), one table per rate")
    parser.add_argument("--vip-share", type=float, default=0.2)
    parser.add_argument("--blocks", type=int, default=2048, help="GPU KV blocks (16 tokens each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot-rate", type=float, default=8.0, help="the rate whose CDFs are plotted")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    defaults = {"num_requests": 1500, "rates": "6,8,12", "vip_share": 0.2, "blocks": 2048, "seed": 0, "plot_rate": 8.0}
    extra = " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k in defaults and v != defaults[k]
    )
    sections, plotted = [f"Command: `{f'python benchmarks/case_study.py {extra}'.strip()}`"], None
    for rate in (float(r) for r in args.rates.split(",")):
        rows = run(args.num_requests, rate, args.vip_share, args.seed, args.blocks)
        sections.append(f"#### {rate:g} requests/s\n\n{markdown(rows)}")
        if plotted is None or rate == args.plot_rate:
            plotted = (rate, rows)
    text = "\n\n".join(sections) + f"\n\n![TTFT CDFs at {plotted[0]:g} requests/s](case-study.png)"
    print(text)
    if not args.no_write:
        plot(plotted[1], PLOT)
        doc = DOC.read_text()
        head, _, rest = doc.partition(START)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{START}\n{text}\n{END}{tail}")
        print(f"wrote {PLOT} and the results block of {DOC}")


if __name__ == "__main__":
    main()
