"""Does the simulator predict the engine? Policies' gains over a baseline, simulated and measured, side by side.

A policy's gain is its metric's relative change against the baseline's (negative: lower, better for a
latency). The measured side is noisy (a shared machine), so the baseline is served several times in the
same run: the spread between those repeats is the noise band. A simulated gain under 2 % is no effect
(the simulation is deterministic); a measured gain inside the band is no effect. The sign agrees when
both sides see the same effect (lower, higher, or none); a simulated effect the measured side cannot
tell from noise is ``noise`` (not confirmed); the size agrees when the measured gain is within the
stated tolerance of the simulated one. The
simulation's own error is given per run: the median per-request E2E error and the errors of the mean
and p99 TTFT (targets of issue 23: 7 %, 10 %, 20 %).
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

TARGETS = {"e2e_median": 0.07, "ttft_mean": 0.10, "ttft_p99": 0.20}
GAIN_METRICS = {
    "ttft_mean": ("ttft_s", "mean"),
    "ttft_p99": ("ttft_s", "p99"),
    "e2e_mean": ("e2e_s", "mean"),
    # mean TTFT in makespans: a machine uniformly slower during one run (other jobs) scales both alike
    "ttft_mean/makespan": ("ttft_s", "mean", "duration_s"),
    # a tiered workload's: what sla-tiers claims (kept only where the summaries have it: class_means)
    "interactive ttft_mean": ("ttft_interactive_s", "mean"),
}
TOLERANCE = {
    "points": 0.05,
    "relative": 0.25,
}  # size agrees: |measured - simulated| <= max(5 points, 25 % of simulated)
MIN_EFFECT = 0.02  # a gain under 2 % (or under the baseline's spread, if larger) is no effect


def metric(summary: dict, name: str) -> float:
    group, stat, *per = GAIN_METRICS[name]
    return float(summary[group][stat]) / (float(summary[per[0]]) if per else 1.0)


def relative(value: float, reference: float) -> float | None:
    return None if not reference else value / reference - 1


def by_request(path: Path, column: str = "e2e") -> dict[str, float]:
    """``request_id -> value`` of one column of a results folder's ``requests.csv`` (requests that have one)."""
    with open(path / "requests.csv", newline="") as f:
        return {row["request_id"]: float(row[column]) for row in csv.DictReader(f) if row[column] not in ("", "None")}


def class_means(ttft: dict[str, float], classes: dict[str, str | None]) -> dict[str, dict[str, float]]:
    """Mean TTFT per SLO class (``ttft_<class>_s``, a summary group ``metric`` reads) from ``request_id -> ttft``."""
    groups: dict[str, list[float]] = {}
    for rid, value in ttft.items():
        slo_class = classes.get(rid)
        if slo_class is not None:
            groups.setdefault(f"ttft_{slo_class}_s", []).append(value)
    return {name: {"mean": statistics.fmean(values)} for name, values in sorted(groups.items())}


def sim_errors(sim: dict, real: dict, sim_e2e: dict[str, float], real_e2e: dict[str, float]) -> dict[str, float | None]:
    """The simulation's error against one measured run: median |per-request E2E error|, signed TTFT mean and p99
    errors."""
    common = [rid for rid in real_e2e if rid in sim_e2e and real_e2e[rid] > 0]
    per_request = [abs(sim_e2e[rid] - real_e2e[rid]) / real_e2e[rid] for rid in common]
    return {
        "e2e_median": statistics.median(per_request) if per_request else None,
        "ttft_mean": relative(metric(sim, "ttft_mean"), metric(real, "ttft_mean")),
        "ttft_p99": relative(metric(sim, "ttft_p99"), metric(real, "ttft_p99")),
        "matched_requests": len(common),
    }


def effect(gain: float | None, band: float) -> int:
    """-1, 0 or +1: the gain's direction, 0 inside the noise band."""
    if gain is None or abs(gain) <= band:
        return 0
    return 1 if gain > 0 else -1


def sign(simulated: int, measured: int) -> str:
    if simulated == measured:
        return "agrees"
    return "noise" if measured == 0 else "disagrees"


def compare_gains(baseline: str, sim: dict[str, dict], real: dict[str, list[dict]], name: str) -> dict:
    """Per policy, the simulated and measured gain of metric ``name`` against ``baseline``.

    ``sim`` maps a policy to its simulated summary, ``real`` to its measured summaries (the baseline's
    repeats, one or more for the others). The measured gain is against the mean of the baseline's
    repeats, its range against each repeat."""
    bases = [metric(s, name) for s in real[baseline]]
    base = statistics.fmean(bases)
    spread = max((abs(a / b - 1) for a in bases for b in bases if b), default=0.0)
    band = max(MIN_EFFECT, spread)
    rows = {}
    for policy in sim:
        if policy == baseline or not real.get(policy):
            continue
        simulated = relative(metric(sim[policy], name), metric(sim[baseline], name))
        values = [metric(s, name) for s in real[policy]]
        measured = relative(statistics.fmean(values), base)
        spread_gains = [relative(v, b) for v in values for b in bases]
        tolerance = max(TOLERANCE["points"], TOLERANCE["relative"] * abs(simulated or 0.0))
        rows[policy] = {
            "simulated": simulated,
            "measured": measured,
            "measured_range": [min(spread_gains), max(spread_gains)],
            "sign": sign(effect(simulated, MIN_EFFECT), effect(measured, band)),
            "size_agrees": simulated is not None and measured is not None and abs(measured - simulated) <= tolerance,
            "tolerance": tolerance,
        }
    return {"metric": name, "baseline": baseline, "noise_band": band, "baseline_spread": spread, "policies": rows}


def pct(x: float | None, signed: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f} %" if signed else f"{100 * x:.1f} %"


SIGN_CELLS = {"agrees": "agrees", "disagrees": "**disagrees**", "noise": "**within noise**"}


def gains_table(gains: dict) -> list[str]:
    lines = [
        f"| policy | simulated {gains['metric']} | measured (range over baseline repeats) | sign | size |",
        "|---|---|---|---|---|",
    ]
    for policy, r in gains["policies"].items():
        low, high = r["measured_range"]
        lines.append(
            f"| {policy} | {pct(r['simulated'])} | {pct(r['measured'])} ({pct(low)} … {pct(high)}) | "
            f"{SIGN_CELLS[r['sign']]} | "
            f"{'within' if r['size_agrees'] else '**outside**'} ±{100 * r['tolerance']:.0f} pt |"
        )
    return lines


def errors_table(runs: list[dict]) -> list[str]:
    lines = [
        "| run | median per-request E2E error | TTFT mean error | TTFT p99 error | mean TTFT measured / simulated "
        "(s) | measured TPOT ÷ simulated | preemptions measured / simulated |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        e = run["errors"]

        def cell(key, signed=True):
            value = e[key]
            miss = value is not None and abs(value) > TARGETS[key]
            return f"**{pct(value, signed)}**" if miss else pct(value, signed)

        lines.append(
            f"| {run['label']} | {cell('e2e_median', False)} | {cell('ttft_mean')} | {cell('ttft_p99')} | "
            f"{metric(run['real'], 'ttft_mean'):.2f} / {metric(run['sim'], 'ttft_mean'):.2f} | "
            f"{run['real']['tpot_s']['mean'] / run['sim']['tpot_s']['mean']:.2f}× | {preemptions(run['real'])} / "
            f"{preemptions(run['sim'])} |"
        )
    return lines


def preemptions(summary: dict) -> str:
    """A run's preemptions (vLLM's counter on the measured side), or "?" where it was not recorded."""
    count = summary.get("preemptions")
    return "?" if count is None else str(sum(count.values()))


def markdown(result: dict) -> str:
    """The Markdown tables of a result (``benchmarks/fidelity_policies.py``'s JSON): gains, then errors."""
    out = []
    for gains in result["gains"]:
        out += [
            f"Gain in {gains['metric']} against {gains['baseline']} (noise band ±{100 * gains['noise_band']:.1f} %: "
            f"the baseline's repeats differ by up to {100 * gains['baseline_spread']:.1f} %)",
            "",
            *gains_table(gains),
            "",
        ]
    targets = ", ".join(f"{k} ≤ {100 * v:.0f} %" for k, v in TARGETS.items())
    out += [f"The simulation's error per run (targets: {targets}; misses in bold)", "", *errors_table(result["runs"])]
    return "\n".join(out) + "\n"


def build(result_runs: list[dict], baseline: str = "vllm-v1") -> dict:
    """The gains of every metric in ``GAIN_METRICS`` that every run's summaries have, from runs ``{policy, label,
    sim, real, errors}``."""
    sim = {r["policy"]: r["sim"] for r in result_runs}
    real: dict[str, list[dict]] = {}
    for r in result_runs:
        real.setdefault(r["policy"], []).append(r["real"])
    if baseline not in real:
        return []
    present = [
        name
        for name, (group, *_) in GAIN_METRICS.items()
        if all(group in r["sim"] and group in r["real"] for r in result_runs)
    ]
    return [compare_gains(baseline, sim, real, name) for name in present]
