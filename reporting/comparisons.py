"""Plots that put several runs side by side: a sweep's throughput/latency trade-off, a comparison's CDFs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.experiments.sweep import METRICS
from kvsched.reporting.plots import pyplot

if TYPE_CHECKING:
    from kvsched.experiments.compare import PolicyRun


def _short(key: str) -> str:
    """``max_num_batched_tokens`` → ``mnbt``: plot labels must stay short to stay readable."""
    return "".join(w[0] for w in key.split("_") if w)


def tradeoff_plot(rows: list[dict[str, Any]], path, title: str = "") -> Any:
    """Throughput vs p99 TTFT, one numbered point per configuration, one colour per policy; hollow
    where a configuration ignored or aborted more requests than the sweep's best one (its latencies
    are over fewer, often shorter, requests).

    The numbers are keyed to their settings in a panel beside the plot (labels next to the points
    overlapped wherever configurations land close together), and the numbers of spots that are
    close on the plot are stacked; configurations that land on the same spot (a setting the policy
    ignores) share one number.
    """
    plt = pyplot()
    keys = (
        [
            k
            for k in rows[0]
            if k not in ("label", "policy") and k not in {m for m, _ in METRICS} | {"profile", "wall_s", "warnings"}
        ]
        if rows
        else []
    )
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fewest = min((r["ignored"] + r["aborted"] for r in rows), default=0)
    spots: dict[tuple, list[str]] = {}
    for pol in policies:
        for r in rows:
            if r["policy"] == pol and r["ttft_p99_s"] is not None:
                spot = (
                    pol,
                    f"{r['ttft_p99_s']:.3g}",
                    f"{r['output_tokens_per_s']:.4g}",
                    r["ignored"] + r["aborted"] > fewest,
                )
                spots.setdefault(spot, []).append(
                    " ".join(
                        f"{_short(k)}={r[k]:g}" if isinstance(r[k], float) else f"{_short(k)}={r[k]}" for k in keys
                    )
                )
    fig, (ax, key) = plt.subplots(
        1, 2, figsize=(12, max(5.5, 0.16 * len(spots) + 1)), gridspec_kw={"width_ratios": [3, 1.6]}
    )
    for i, pol in enumerate(policies):
        for short in (
            False,
            True,
        ):  # a point that served fewer requests than the others is hollow: its latencies flatter it
            mine = [(float(x), float(y)) for (p, x, y, s) in spots if p == pol and s is short]
            if mine:
                ax.scatter(
                    [x for x, _ in mine],
                    [y for _, y in mine],
                    label=f"{pol}, fewer requests served" if short else pol,
                    s=30,
                    color="none" if short else f"C{i}",
                    edgecolors=f"C{i}",
                )
    key.axis("off")
    ax.set_xscale("log")
    ax.autoscale_view()
    placed: list[tuple[float, float]] = []  # where the numbers went, in pixels: close spots stack theirs upwards
    for n, ((pol, x, y, _), labels) in enumerate(spots.items(), start=1):
        colour = f"C{policies.index(pol)}"
        px, py = ax.transData.transform((float(x), float(y)))
        stacked = sum(1 for qx, qy in placed if abs(qx - px) < 16 and abs(qy - py) < 12)
        placed.append((px, py))
        ax.annotate(
            str(n),
            (float(x), float(y)),
            fontsize=7,
            xytext=(3, 3 + 9 * stacked),
            textcoords="offset points",
            color=colour,
        )
        text = labels[0] if len(labels) == 1 else f"{labels[0]} (+{len(labels) - 1} alike)"
        key.text(
            0,
            1 - (n - 0.5) / max(len(spots), 1),
            f"{n:>3}  {pol}: {text}",
            fontsize=7,
            color=colour,
            va="center",
            family="monospace",
            transform=key.transAxes,
        )
    key.set_title(", ".join(f"{_short(k)} = {k}" for k in keys), fontsize=7, loc="left")
    ax.set(xlabel="p99 TTFT (s)", ylabel="throughput (output tokens/s)", title=title or "throughput vs p99 TTFT")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_cdfs(runs: list[PolicyRun], path: Path, title: str) -> Path:
    """Two panels, TTFT and TPOT, one empirical CDF per policy (pooled over its seeds), under ``title`` (PNG)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, attr, name, scale, unit in ((axes[0], "ttft", "TTFT", 1, "s"), (axes[1], "tpot", "TPOT", 1000, "ms")):
        for run in runs:
            values = sorted(v * scale for v in getattr(run, attr))
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=run.policy)
        ax.set_xlabel(f"{name} ({unit})")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name} CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
