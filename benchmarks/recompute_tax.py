"""The recompute tax against the KV-cache size, per preemption victim rule (vLLM RFC #54644's offline sweep).

RFC #54644 ran 300 offline requests (seed 12345) on a 0.5B model with a 4,200-block pool capped to
2,800 / 1,600 / 800 / 400 blocks: tax about 0 / 32 / 58 / 79 %, least-computed-first (LCF) cutting
the wasted tokens by 59 / 40 / 43 %, and the victim ranking LCF > LIFO > random > most computed first.

Here: 300 requests of a real trace's lengths (seeded sample), all arriving at once (offline), on
vLLM V1's rules (``lcf`` with ``victim`` = lifo, the V1 default, or lcf, random, mcf; block size 16,
256 sequences, 8,192 tokens a step, prefix caching on). The RFC's request lengths are not stated, so
its pool sizes cannot be copied; instead the largest size is the smallest pool in which this
workload runs without a preemption (found by bisection, as the RFC's 2,800 is), and the others keep
the RFC's ratios to it (1,600 / 2,800, 800 / 2,800, 400 / 2,800). Writes a CSV and prints a table.

    .venv/bin/python benchmarks/recompute_tax.py --workload sharegpt --out docs/figures/recompute-tax-sharegpt.csv

``--fixed-input 512 --rate 4 --blocks 1500,700`` runs the RFC's other set-up instead: online (Poisson
arrivals), every prompt 512 tokens, LIFO against LCF at each pool size.
"""

from __future__ import annotations

import argparse
import csv
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

RFC_BLOCKS = (2800, 1600, 800, 400)
RFC_TAX = {2800: 0.0, 1600: 32.2, 800: 57.9, 400: 78.8}
VICTIMS = ("lifo", "lcf", "random", "mcf")
CONFIG = dict(block_size=16, max_num_seqs=256, max_num_batched_tokens=8192, vllm_engine="v1", watermark=0.0)


def requests(workload: str, num: int, seed: int, cut: int | None = None, online: tuple[int, float] | None = None):
    """Offline: the trace's lengths, all at once. ``online`` = (prompt length, rate): every prompt that
    long (the trace's outputs), Poisson arrivals at that rate (the RFC's fixed-512-input runs)."""
    from kvsched.workloads import build_workload

    if online is not None:
        load = build_workload(workload, rate=online[1], num_requests=num, seed=seed)
        return [r.model_copy(update={"prompt_len": online[0]}) for r in load.requests()]
    load = build_workload(workload, num_requests=num, seed=seed, max_total_tokens=cut)
    return [r.model_copy(update={"arrival_time": 0.0}) for r in load.requests()]


def run(
    workload: str,
    num: int,
    seed: int,
    blocks: int,
    victim: str,
    caching: bool = True,
    cut: int | None = None,
    online: tuple[int, float] | None = None,
) -> dict:
    from kvsched import Engine, EngineConfig, SimulatedExecutor
    from kvsched.metrics.requests import RequestMetrics, summarize
    from kvsched.policies.lcf import Lcf

    engine = Engine(
        EngineConfig(num_gpu_blocks=blocks, enable_prefix_caching=caching, **CONFIG),
        Lcf(victim=victim, seed=seed),
        SimulatedExecutor(),
    )
    engine.run(requests(workload, num, seed, cut, online))
    summary = summarize(engine, [RequestMetrics.of(g) for g in engine.finished])
    tax = summary["recompute"]
    return {
        "workload": workload,
        "blocks": blocks,
        "victim": victim,
        "finished": summary["finished"],
        "caching": caching,
        "preemptions": summary["preemptions"]["recompute"],
        "tax_pct": round(100 * tax["tax"], 1),
        "discarded_share_pct": round(100 * tax["discarded_share"], 1),
        "recomputed_tokens": tax["recomputed_tokens"],
        "discarded_tokens": tax["discarded_tokens"],
        "computed_tokens": tax["computed_tokens"],
        "discarded_per_preemption": None
        if tax["discarded_per_preemption"] is None
        else round(tax["discarded_per_preemption"]),
        "mean_ttft_s": round(summary["ttft_s"]["mean"], 3),
        "p99_ttft_s": round(summary["ttft_s"]["p99"], 3),
        "duration_s": round(summary["duration_s"], 2),
    }


def no_preemption_size(workload: str, num: int, seed: int, caching: bool, cut: int | None, hi: int = 1 << 17) -> int:
    """The smallest pool (in blocks, to 1 %) in which V1 runs the workload without preempting."""
    lo = 1
    while hi - lo > max(hi // 100, 1):
        mid = (lo + hi) // 2
        row = run(workload, num, seed, mid, "lifo", caching, cut)
        ok = row["preemptions"] == 0 and row["finished"] == num  # a prompt too long for the pool is ignored
        lo, hi = (lo, mid) if ok else (mid + 1, hi)
    return hi


def write_rows(path: Path, rows: list[dict]) -> None:
    """The rows as a CSV file (its folder made if need be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def fixed_input(args, caching: bool) -> None:
    """LIFO against LCF online, every prompt ``--fixed-input`` tokens long, at each pool size of ``--blocks``."""
    online = (args.fixed_input, args.rate)
    jobs = [
        (args.workload, args.requests, args.seed, int(b), v, caching, None, online)
        for b in args.blocks.split(",")
        for v in ("lifo", "lcf")
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(run, *zip(*jobs)))
    print(
        f"{args.workload} outputs, every prompt {args.fixed_input} tokens, {args.requests} requests at {args.rate} "
        f"req/s Poisson (seed {args.seed})"
    )
    print("| blocks | victim | preemptions | discarded tokens | discarded share | mean TTFT (s) | p99 TTFT (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['blocks']} | {r['victim']} | {r['preemptions']} | {r['discarded_tokens']:,} | "
            f"{r['discarded_share_pct']} % | {r['mean_ttft_s']} | {r['p99_ttft_s']} |"
        )
    if args.out:
        write_rows(args.out, rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="sharegpt", help="a built-in trace: sharegpt or azure-conv")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--full", type=int, default=None, help="the no-preemption size, if known (skips the bisection)")
    parser.add_argument("--no-prefix-caching", action="store_true", help="every discarded token is then recomputed")
    parser.add_argument(
        "--max-total-tokens", type=int, default=None, help="cut prompts so that prompt + output <= this (Vidur's cut)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--fixed-input",
        type=int,
        default=None,
        help="online instead: every prompt this long, arrivals at --rate, pools --blocks",
    )
    parser.add_argument("--rate", type=float, default=4.0)
    parser.add_argument("--blocks", default="1500,700")
    args = parser.parse_args(argv)
    caching = not args.no_prefix_caching
    if args.fixed_input:
        return fixed_input(args, caching)
    cut = args.max_total_tokens
    full = args.full or no_preemption_size(args.workload, args.requests, args.seed, caching, cut)
    sizes = {rfc: max(1, round(full * rfc / RFC_BLOCKS[0])) for rfc in RFC_BLOCKS}
    jobs = [
        (args.workload, args.requests, args.seed, sizes[rfc], v, caching, cut) for rfc in RFC_BLOCKS for v in VICTIMS
    ]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(run, *zip(*jobs)))
    for row in rows:
        row["rfc_blocks"] = next(rfc for rfc, b in sizes.items() if b == row["blocks"])
    cutting = f"prompts cut to {cut} tokens with their output; " if cut else ""
    print(
        f"{args.workload}, {args.requests} requests at once, seed {args.seed}, prefix caching "
        f"{'on' if caching else 'off'}; {cutting}no preemption from {full} blocks; tax = recomputed / computed "
        "(discarded share: as if none were cached)"
    )
    print(
        "| RFC size | our blocks | RFC tax (lifo) | "
        + " | ".join(f"tax {v}" for v in VICTIMS)
        + " | LCF waste vs lifo | discarded / preemption (lifo → lcf) |"
    )
    print("|---|---|---|" + "---|" * len(VICTIMS) + "---|---|")
    for rfc in RFC_BLOCKS:
        by = {r["victim"]: r for r in rows if r["rfc_blocks"] == rfc}
        lifo, lcf = by["lifo"], by["lcf"]
        cut = (
            f"{100 * (lcf['discarded_tokens'] / lifo['discarded_tokens'] - 1):+.0f} %"
            if lifo["discarded_tokens"]
            else "–"
        )
        print(
            f"| {rfc} | {sizes[rfc]} | {RFC_TAX[rfc]} % | "
            + " | ".join(f"{by[v]['tax_pct']} % ({by[v]['discarded_share_pct']} %)" for v in VICTIMS)
            + f" | {cut} | {lifo['discarded_per_preemption']} → {lcf['discarded_per_preemption']} |"
        )
    if args.out:
        write_rows(args.out, rows)


if __name__ == "__main__":
    sys.exit(main())
