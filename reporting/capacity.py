"""``engine capacity``'s files: ``capacity.json`` (every load tried, every capacity, the paired statistics),
``capacity.md`` (the table) and, with ``--plot``, ``capacity.png`` (SLO goodput against the offered rate, a colour per
contender)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvsched.experiments.capacity import CAPACITY, Search
from kvsched.experiments.evidence import Contest, cell_text, change_text, rank_cell, statistics_note
from kvsched.reporting.destination import publishing_folder
from kvsched.reporting.plots import pyplot

CAPACITY_FILES = ("capacity.json", "capacity.md", "capacity.png")


def capacity_rows(contest: Contest) -> tuple[list[str], list[list[str]]]:
    """A row per contender, best first: its rank, its capacity (mean and interval over the seeds), its paired change."""
    ranks = contest.ranks(CAPACITY)
    head = ["contender", "rank", CAPACITY.heading, f"vs {contest.baseline}"]
    order = sorted(contest.contenders, key=lambda c: ranks[c])
    return head, [
        [
            c,
            rank_cell(ranks, c),
            cell_text(contest.cell(c, CAPACITY), CAPACITY),
            change_text(contest.change(c, CAPACITY), CAPACITY) if c != contest.baseline else "baseline",
        ]
        for c in order
    ]


def capacity_doc(
    searches: dict[str, list[Search]], contest: Contest, seeds: list[int], slo: dict[str, float], about: dict[str, Any]
) -> dict[str, Any]:
    """``capacity.json``: what was asked (``about``: command, workload, profile, fleet), every load, the statistics."""
    return {
        **about,
        "slo": slo,
        "seeds": seeds,
        "baseline": contest.baseline,
        "searches": {
            c: [
                {"seed": seed, "capacity_req_per_s": s.capacity, "loads": [vars(load) for load in s.loads]}
                for seed, s in zip(seeds, runs)
            ]
            for c, runs in searches.items()
        },
        "statistics": contest.as_dict([CAPACITY]),
    }


def markdown(doc: dict[str, Any], contest: Contest) -> str:
    head, rows = capacity_rows(contest)
    slo = ", ".join(f"{k.removesuffix('_s')} ≤ {v:g} s" for k, v in doc["slo"].items())
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]
    return "\n".join(lines) + (
        f"\n\nThe highest request rate within the SLO ({slo}; no request aborted), found by bisection on each "
        f"of seeds {', '.join(map(str, doc['seeds']))}. {statistics_note(contest.level)}\n\n`{doc['command']}`\n"
    )


def plot(doc: dict[str, Any], path: Path) -> Path:
    """SLO goodput against the offered rate: every load tried, a colour per contender, its capacity dashed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (contender, runs) in enumerate(doc["searches"].items()):
        loads = sorted((load for run in runs for load in run["loads"]), key=lambda load: load["offered"])
        ax.plot(
            [x["offered"] for x in loads],
            [x["goodput"] for x in loads],
            "o",
            color=f"C{i}",
            alpha=0.7,
            label=contender,
            markerfacecolor="none",
        )
        capacity = doc["statistics"]["metrics"][CAPACITY.key]["cells"][contender]
        if capacity and capacity["mean"] > 0:
            ax.axvline(capacity["mean"], color=f"C{i}", ls="--", lw=1)
    ax.set(
        xscale="log",
        xlabel="offered load (requests/s)",
        ylabel="SLO goodput (requests/s)",
        title="goodput against load; dashed: each contender's capacity (mean over seeds)",
    )
    plain = plt.matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}")  # 2, not 2×10⁰
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_capacity(doc: dict[str, Any], contest: Contest, directory: Path, with_plot: bool) -> list[Path]:
    """The files under ``directory``, published together (``reporting/destination.py``)."""
    names = CAPACITY_FILES if with_plot else CAPACITY_FILES[:2]
    with publishing_folder(directory, CAPACITY_FILES) as stage:
        (stage / "capacity.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        (stage / "capacity.md").write_text(markdown(doc, contest), encoding="utf-8")
        if with_plot:
            plot(doc, stage / "capacity.png")
    return [Path(directory) / name for name in names]
