"""PNG plots of one run: latency CDFs, queues and KV usage over time, batch composition.

matplotlib with the Agg backend (no display needed); each figure is small enough to commit.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

DPI = 90


def pyplot():
    """matplotlib.pyplot on the Agg backend: plots are files, and no display is needed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values, label: str) -> None:
    import numpy as np

    v = np.sort(np.asarray(values, dtype=float))
    v = v[~np.isnan(v)]
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label, drawstyle="steps-post")


def _title(summary: dict) -> str:
    w = summary.get("workload", {})
    name = w.get("name") or w.get("kind", "workload")
    scale = f" ×{w['rate_scale']:g}" if w.get("rate_scale", 1) != 1 else ""
    return f"{summary['policy']} · {name}{scale} · {summary.get('profile', '')}"


def _save(plt, fig, axes, summary: dict, path: Path) -> Path:
    """The finish every figure shares: grid, run title, tight layout, PNG, figure closed."""
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(_title(summary), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def latency_cdfs(req: pd.DataFrame, summary: dict, path: Path) -> Path:
    from kvsched.metrics.requests import DONE

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    done = req[req.status.isin(DONE)]
    _cdf(axes[0], done.ttft, "TTFT")
    axes[0].set(xlabel="time to first token (s)", ylabel="share of requests", xscale="symlog", title="TTFT CDF")
    _cdf(axes[1], done.tpot * 1000, "TPOT")
    axes[1].set(xlabel="time per output token (ms)", title="TPOT CDF")
    slo = summary.get("slo") or {}
    if slo.get("slo_ttft_s"):
        axes[0].axvline(slo["slo_ttft_s"], color="red", ls="--", lw=1, label="SLO")
    if slo.get("slo_tpot_s"):
        axes[1].axvline(slo["slo_tpot_s"] * 1000, color="red", ls="--", lw=1, label="SLO")
    return _save(plt, fig, axes, summary, path)


def queues_and_kv(ts: pd.DataFrame, summary: dict, path: Path) -> Path:
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    t = ts.time_s
    top.plot(t, ts.num_waiting, label="waiting (left axis)", lw=0.8, color="C0")
    top.set(ylabel="waiting requests", title="queues over time")
    right = top.twinx()  # running and swapped have their own axis: the waiting queue can be 100× longer
    for col, label, colour in (("num_running", "running", "C1"), ("num_swapped", "swapped", "C2")):
        right.plot(t, ts[col], label=f"{label} (right axis)", lw=0.8, color=colour)
    right.set_ylabel("running / swapped requests")
    right.set_ylim(bottom=0)
    handles = top.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    right.legend(handles=handles, loc="upper left", fontsize=8)  # on the twin, which is drawn over the first axes
    total = summary.get("kv_usage", {}).get("gpu_blocks_total") or summary["config"]["num_gpu_blocks"]
    bottom.plot(t, 100 * ts.gpu_blocks_used / total, label="GPU KV blocks used", lw=0.8)
    cpu_total = summary["config"]["num_cpu_blocks"]
    if cpu_total and ts.cpu_blocks_used.max() > 0:
        bottom.plot(t, 100 * ts.cpu_blocks_used / cpu_total, label="CPU (swap) blocks used", lw=0.8)
    bottom.set(xlabel="simulated time (s)", ylabel="% of pool", ylim=(0, 105), title="KV-cache usage")
    bottom.legend(loc="lower right", fontsize=8)
    return _save(plt, fig, (top, bottom), summary, path)


def batch_composition(ts: pd.DataFrame, summary: dict, path: Path, bins: int = 200) -> Path:
    """Per time bin: mean decode sequences and prefill tokens per step (each on its own axis), and preemptions."""
    import numpy as np

    plt = pyplot()
    edges = np.linspace(ts.time_s.min(), ts.time_s.max() + 1e-9, bins + 1)
    idx = np.clip(np.digitize(ts.time_s, edges) - 1, 0, bins - 1)
    grouped = ts.assign(bin=idx).groupby("bin")
    mid = (edges[:-1] + edges[1:]) / 2
    dec = grouped.decode_seqs.mean().reindex(range(bins))
    pre = grouped.prefill_tokens.mean().reindex(range(bins))
    share = grouped.prefill_groups.apply(lambda s: (s > 0).mean()).reindex(range(bins))
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    a.plot(mid, dec, label="decode sequences / step (left axis)", lw=0.9, color="C0")
    a.set(ylabel="decode sequences / step", title="batch composition")
    a2 = a.twinx()
    a2.plot(mid, pre, label="prefill tokens / step (right axis)", lw=0.9, color="C1")
    a2.set_ylabel("prefill tokens / step")
    a2.set_ylim(bottom=0)
    a2.legend(
        handles=a.get_legend_handles_labels()[0] + a2.get_legend_handles_labels()[0], loc="upper left", fontsize=8
    )
    b.plot(mid, 100 * share, lw=0.9, color="tab:purple", label="prefill steps (% of steps)")
    pre_r = grouped.preempted_recompute.sum().reindex(range(bins), fill_value=0)
    pre_s = grouped.preempted_swap.sum().reindex(range(bins), fill_value=0)
    b2 = b.twinx()
    b2.bar(mid, pre_r + pre_s, width=(edges[1] - edges[0]), alpha=0.3, color="tab:red", label="preemptions")
    b2.set_ylabel("preemptions / bin")
    b.set(xlabel="simulated time (s)", ylabel="% prefill steps")
    b.legend(loc="upper left", fontsize=8)
    b2.legend(loc="upper right", fontsize=8)
    return _save(plt, fig, (a, b), summary, path)


def run_plots(req: pd.DataFrame, ts: pd.DataFrame | None, summary: dict, directory: Path) -> list[Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = [latency_cdfs(req, summary, directory / "latency_cdf.png")]
    if ts is not None and len(ts):
        out.append(queues_and_kv(ts, summary, directory / "queues_kv.png"))
        out.append(batch_composition(ts, summary, directory / "batch_composition.png"))
    return out
