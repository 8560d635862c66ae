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
    """Throughput vs p99 TTFT, one labelled point per configuration, one colour per policy.

    Configurations that land on the same spot (a setting the policy ignores) share one label.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    keys = [k for k in rows[0] if k not in ("label", "policy") and k not in {m for m, _ in METRICS} | {"profile", "wall_s"}] if rows else []
    spots: dict[tuple, list[str]] = {}
    for i, pol in enumerate(policies):
        pts = [r for r in rows if r["policy"] == pol and r["ttft_p99_s"] is not None]
        ax.scatter([r["ttft_p99_s"] for r in pts], [r["output_tokens_per_s"] for r in pts], label=pol, color=f"C{i}", s=30)
        for r in pts:
            spot = (pol, f"{r['ttft_p99_s']:.3g}", f"{r['output_tokens_per_s']:.4g}")
            spots.setdefault(spot, []).append(" ".join(f"{_short(k)}={r[k]:g}" if isinstance(r[k], float) else f"{_short(k)}={r[k]}" for k in keys))
    for n, ((pol, x, y), labels) in enumerate(spots.items()):
        text = labels[0] if len(labels) == 1 else f"{labels[0]} (+{len(labels) - 1} alike)"
        ax.annotate(text, (float(x), float(y)), fontsize=6, xytext=(4, 4 + 8 * (n % 3)), textcoords="offset points",
                    color=f"C{policies.index(pol)}")
    legend = ", ".join(f"{_short(k)} = {k}" for k in keys)
    ax.set(xlabel="p99 TTFT (s)", ylabel="throughput (output tokens/s)", title=title or "throughput vs p99 TTFT")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title=legend, title_fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_cdfs(runs: list[PolicyRun], path: Path) -> Path:
    """Two panels, TTFT and TPOT, one empirical CDF per policy (PNG)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, attr, title, scale, unit in ((axes[0], "ttft", "TTFT", 1, "s"), (axes[1], "tpot", "TPOT", 1000, "ms")):
        for run in runs:
            values = sorted(v * scale for v in getattr(run, attr))
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=run.policy)
        ax.set_xlabel(f"{title} ({unit})")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{title} CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
