"""The interactive charts of ``report.html`` (Plotly figures), each with the caption shown under it.

What ``vllm bench serve`` reports (TTFT, TPOT, ITL and E2E latency) and what Vidur users look at
(scheduling delay, latency per output token, batch size and batched tokens, throughput and
arrivals over time), plus what only the decision log knows: where the waiting went, and why
requests were preempted or ignored. Time series are averaged over at most ``BINS`` bins and
curves cut to ``POINTS`` points, so the page stays small for long runs (and short runs get bins of
at least ``STEPS_PER_BIN`` steps on average, so they are not noise).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvsched.metrics.requests import DONE
from kvsched.metrics.wait_reasons import WaitReasons

BINS = 600
STEPS_PER_BIN = 20
POINTS = 400
QUEUE_COLOURS = {"waiting": "#1f77b4", "swapped": "#9467bd", "running": "#d62728"}


@dataclass
class Chart:
    key: str  # the element id
    title: str
    caption: str
    figure: go.Figure


def figure_layout(fig: go.Figure, height: int = 360, **kw) -> go.Figure:
    fig.update_layout(
        **{
            "height": height,
            "margin": dict(l=60, r=60, t=30, b=50),
            "template": "plotly_white",
            "legend": dict(orientation="h", y=-0.2),
            "hovermode": "x unified",
            **kw,
        }
    )
    fig.update_traces(connectgaps=True, selector=dict(type="scatter"))  # a time bin in which no step ended
    return fig


def _cdf(values, counts=None) -> tuple[np.ndarray, np.ndarray]:
    """(x, share of values ≤ x) at ``POINTS`` quantiles; ``counts`` weights sorted distinct ``values``."""
    values = np.asarray(values, dtype=float)
    if counts is None:
        values = np.sort(values[~np.isnan(values)])
        counts = np.ones(len(values))
    if not len(values):
        return np.array([]), np.array([])
    share = np.cumsum(counts) / np.sum(counts)
    at = np.unique(np.searchsorted(share, np.linspace(0, 1, POINTS), side="left").clip(0, len(values) - 1))
    return values[at], share[at]


def _bins(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each step's time bin, and the bins' midpoints."""
    t = steps.time_s.to_numpy()
    edges = np.linspace(t.min(), t.max() + 1e-9, max(1, min(BINS, len(t) // STEPS_PER_BIN)) + 1)
    return np.clip(np.digitize(t, edges) - 1, 0, len(edges) - 2), (edges[:-1] + edges[1:]) / 2


def _binned(values, bins: np.ndarray, n: int, weights=None) -> np.ndarray:
    """Mean of ``values`` per bin (``weights``: a time-weighted mean)."""
    w = np.ones(len(bins)) if weights is None else np.asarray(weights, dtype=float)
    total = np.bincount(bins, weights=w, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(bins, weights=np.asarray(values, dtype=float) * w, minlength=n) / total


def _over_time(
    mid: np.ndarray, left: dict[str, np.ndarray], right: dict[str, np.ndarray], left_title: str, right_title: str
) -> go.Figure:
    """Series over simulated time on two y axes (``{name: values per bin}``), each axis from zero:
    quantities of different scales each get their own."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for secondary, series, axis in ((False, left, "left"), (True, right, "right")):
        for name, values in series.items():
            fig.add_trace(go.Scatter(x=mid, y=values, name=f"{name} ({axis} axis)"), secondary_y=secondary)
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(title_text=left_title, secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text=right_title, secondary_y=True, rangemode="tozero", showgrid=False)
    return fig


def latency(requests: pd.DataFrame, itl: tuple[np.ndarray, np.ndarray]) -> Chart:
    done = requests[requests.status.isin(DONE)]
    fig = make_subplots(1, 2, subplot_titles=("TTFT and end-to-end latency", "TPOT and inter-token latency"))
    for col, name in (("ttft", "TTFT"), ("e2e", "E2E")):
        x, y = _cdf(done[col])
        fig.add_trace(go.Scatter(x=x, y=y, name=f"{name} (s)", mode="lines", line_shape="hv"), 1, 1)
    x, y = _cdf(done.tpot * 1000)
    fig.add_trace(go.Scatter(x=x, y=y, name="TPOT (ms)", mode="lines", line_shape="hv"), 1, 2)
    x, y = _cdf(itl[0] * 1000, itl[1])
    fig.add_trace(go.Scatter(x=x, y=y, name="ITL (ms)", mode="lines", line_shape="hv"), 1, 2)
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_xaxes(title_text="milliseconds", type="log", row=1, col=2)
    fig.update_yaxes(title_text="share of requests / tokens", range=[0, 1.02])
    return Chart(
        "latency",
        "TTFT, E2E, TPOT and ITL",
        (
            "Cumulative distributions over finished requests (left, seconds): TTFT is arrival to first token, E2E "
            "arrival to last token. Right (milliseconds, log scale): TPOT is a request's mean gap between output "
            "tokens after the first; ITL is every such gap, over all tokens of all requests, so stalls (prefill-only "
            "steps, preemptions) show in its tail. These are vllm bench serve's four latency metrics."
        ),
        figure_layout(fig, hovermode="closest"),
    )


def vidur_latency(requests: pd.DataFrame) -> Chart:
    done = requests[requests.status.isin(DONE) & (requests.output_tokens > 0)]
    fig = make_subplots(1, 2, subplot_titles=("scheduling delay", "latency per output token"))
    x, y = _cdf(done.queueing_time)
    fig.add_trace(go.Scatter(x=x, y=y, name="scheduling delay (s)", mode="lines", line_shape="hv"), 1, 1)
    x, y = _cdf(1000 * done.e2e / done.output_tokens)
    fig.add_trace(go.Scatter(x=x, y=y, name="E2E ÷ output tokens (ms)", mode="lines", line_shape="hv"), 1, 2)
    fig.update_xaxes(title_text="seconds", row=1, col=1)
    fig.update_xaxes(title_text="ms per output token", row=1, col=2)
    fig.update_yaxes(title_text="share of requests", range=[0, 1.02])
    return Chart(
        "vidur-latency",
        "Scheduling delay and normalised latency",
        (
            "Vidur's two per-request views. Left: scheduling delay, from arrival until the request is first scheduled "
            "(its time in the waiting queue). Right: end-to-end latency divided by the request's output tokens, which "
            "puts long and short answers on one scale."
        ),
        figure_layout(fig, hovermode="closest"),
    )


def queues(steps: pd.DataFrame) -> Chart:
    bins, mid = _bins(steps)
    mean = {q: _binned(steps[f"num_{q}"], bins, len(mid), steps.duration_s) for q in ("waiting", "running", "swapped")}
    fig = _over_time(
        mid,
        {"waiting": mean["waiting"]},
        {"running": mean["running"], "swapped": mean["swapped"]},
        "waiting requests",
        "running / swapped requests",
    )
    return Chart(
        "queues",
        "Queues over time",
        (
            "Requests in each queue after each step, time-weighted means per time bin. The waiting queue has its own "
            "axis (left) because under overload it is orders of magnitude longer than the running and swapped queues "
            "(right)."
        ),
        figure_layout(fig),
    )


def kv_usage(steps: pd.DataFrame, summary: dict) -> Chart:
    bins, mid = _bins(steps)
    config = summary["config"]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=mid,
            y=100 * _binned(steps.gpu_blocks_used, bins, len(mid), steps.duration_s) / config["num_gpu_blocks"],
            name="GPU KV blocks used (%)",
        )
    )
    if config["num_cpu_blocks"] and steps.cpu_blocks_used.max() > 0:
        fig.add_trace(
            go.Scatter(
                x=mid,
                y=100 * _binned(steps.cpu_blocks_used, bins, len(mid), steps.duration_s) / config["num_cpu_blocks"],
                name="CPU (swap) blocks used (%)",
            )
        )
    fig.update_xaxes(title_text="simulated time (s)")
    fig.update_yaxes(title_text="% of the pool", range=[0, 105])
    watermark = 100 * config["watermark"]
    return Chart(
        "kv",
        "KV-cache usage",
        (
            f"Share of the {config['num_gpu_blocks']:,} GPU KV blocks (and of the {config['num_cpu_blocks']:,} CPU "
            f"swap blocks) held after each step, time-weighted per bin. Admission keeps the watermark ({watermark:g}% "
            "of the GPU pool) free, so a pool that stays near the top means prompts wait for blocks."
        ),
        figure_layout(fig),
    )


def throughput(steps: pd.DataFrame, requests: pd.DataFrame, events: pd.DataFrame) -> Chart:
    bins, mid = _bins(steps)
    width = mid[1] - mid[0] if len(mid) > 1 else max(float(steps.time_s.max()), 1e-9)
    first_tokens = events[events.event.isin(("admitted", "prefill")) & (events.tokens_left == 0)].groupby("step").size()
    tokens = steps.decode_seqs.to_numpy() + first_tokens.reindex(steps.step, fill_value=0).to_numpy()
    edges = np.append(mid - width / 2, mid[-1] + width / 2)
    arrivals = np.histogram(requests.arrival_time, edges)[0]
    finished = np.histogram(requests.finish_time[requests.status.isin(DONE)], edges)[0]
    fig = _over_time(
        mid,
        {"arrivals, req/s": arrivals / width, "finished, req/s": finished / width},
        {"output tokens/s": np.bincount(bins, weights=tokens, minlength=len(mid)) / width},
        "requests per second",
        "output tokens per second",
    )
    return Chart(
        "throughput",
        "Throughput and arrivals over time",
        (
            "Requests arriving and finishing per second, and output tokens generated per second, in bins of "
            f"{width:,.1f} s. Arrivals above finishes for long stretches mean the waiting queue grows."
        ),
        figure_layout(fig),
    )


def batch_over_time(steps: pd.DataFrame) -> Chart:
    bins, mid = _bins(steps)
    fig = _over_time(
        mid,
        {"decoding sequences per step": _binned(steps.decode_seqs, bins, len(mid))},
        {"prefill tokens per step": _binned(steps.prefill_tokens, bins, len(mid))},
        "sequences",
        "tokens",
    )
    return Chart(
        "batch-time",
        "Batch composition over time",
        (
            "Mean per step within each time bin: sequences that decode one token (left axis) and prompt tokens "
            "prefilled (right axis, its own scale: a prompt step computes hundreds of tokens where a decode computes "
            "one per sequence)."
        ),
        figure_layout(fig),
    )


def batch_distributions(steps: pd.DataFrame) -> Chart:
    fig = make_subplots(1, 2, subplot_titles=("batch size", "batched tokens"))
    busy = steps[steps.batch_seqs > 0]
    for col, values in ((1, busy.batch_seqs), (2, busy.prefill_tokens + busy.decode_seqs)):
        counts, edges = np.histogram(values, bins=min(60, max(int(values.max()) if len(values) else 1, 1)))
        fig.add_trace(
            go.Bar(
                x=(edges[:-1] + edges[1:]) / 2,
                y=counts / max(len(values), 1),
                width=np.diff(edges),
                name="sequences per step" if col == 1 else "tokens per step",
            ),
            1,
            col,
        )
    fig.update_xaxes(title_text="sequences in the step", row=1, col=1)
    fig.update_xaxes(title_text="tokens computed in the step", row=1, col=2)
    fig.update_yaxes(title_text="share of steps")
    fig.update_yaxes(type="log", row=1, col=2)  # decode steps (one token a sequence) would hide the prompt steps
    return Chart(
        "batch-dist",
        "Batch size and batched tokens",
        (
            "Vidur's batch distributions, over the steps that ran something: sequences per step (prefills plus "
            "decodes) and tokens computed per step (prompt tokens plus one per decoding sequence, at most "
            "max_num_batched_tokens; log scale, so that the few prompt-heavy steps show beside the many decode steps)."
        ),
        figure_layout(fig, hovermode="closest", bargap=0),
    )


def wait_reasons(why: WaitReasons) -> Chart:
    table = why.time_by_reason().head(12)[::-1]
    fig = go.Figure()
    for queue, part in table.groupby("queue", sort=False):
        fig.add_trace(
            go.Bar(x=part.request_s, y=part.reason, orientation="h", name=queue, marker_color=QUEUE_COLOURS.get(queue))
        )
    fig.update_xaxes(title_text="request·seconds")
    fig.update_yaxes(automargin=True, categoryorder="total ascending")
    return Chart(
        "wait-reasons",
        "Time spent waiting, by reason",
        (
            "Time requests spent waiting, by reason, from the decision log (engine explain DIR prints the same table): "
            "each step adds its duration once for every request it left waiting, with that request's reason. Blue: in "
            "the waiting queue; purple: swapped out; red: running but not run in a step, or preempted."
        ),
        figure_layout(fig, height=80 + 34 * max(len(table), 1), hovermode="closest", barmode="stack"),
    )


def preempted_and_ignored(events: pd.DataFrame) -> Chart:
    fig = make_subplots(1, 2, subplot_titles=("preemptions", "ignored requests"))
    pre = events[events.event == "preempted"]
    cause = np.where(
        pre.other_request.isna(),
        "by the policy",
        np.where(pre.other_request == pre.request_id, "itself short of blocks", "to make room for another"),
    )
    counts = pd.Series(pre.reason.to_numpy() + ", " + cause).value_counts() if len(pre) else pd.Series(dtype=int)
    fig.add_trace(go.Bar(x=counts.index, y=counts.to_numpy(), name="preemptions"), 1, 1)
    rules = events.detail[events.event == "ignored"].str.replace(r"\d+", "N", regex=True).value_counts()
    fig.add_trace(go.Bar(x=rules.index, y=rules.to_numpy(), name="ignored"), 1, 2)
    for col, empty, what in ((1, pre.empty, "no preemption"), (2, rules.empty, "no request was ignored")):
        if empty:
            fig.add_annotation(
                text=what,
                showarrow=False,
                xref="x domain" if col == 1 else "x2 domain",
                yref="y domain" if col == 1 else "y2 domain",
                x=0.5,
                y=0.5,
            )
    fig.update_yaxes(title_text="requests", rangemode="tozero")
    return Chart(
        "preempted-ignored",
        "Preempted and ignored requests, by reason",
        (
            f"Left: the run's {len(pre):,} preemptions by mode (recompute: back to waiting; swap: blocks to the CPU) "
            f"and cause. Right: the {int(rules.sum()):,} requests that could never run, by the rule that stopped them "
            "(numbers written N)."
        ),
        figure_layout(fig, hovermode="closest", showlegend=False),
    )


def all_charts(
    summary: dict,
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    events: pd.DataFrame,
    why: WaitReasons,
    itl: tuple[np.ndarray, np.ndarray],
) -> list[tuple[str, list[Chart]]]:
    """The report's sections, in order."""
    return [
        ("Latency", [latency(requests, itl), vidur_latency(requests)]),
        ("Load over time", [queues(steps), kv_usage(steps, summary), throughput(steps, requests, events)]),
        ("Batches", [batch_over_time(steps), batch_distributions(steps)]),
        ("Why requests waited", [wait_reasons(why), preempted_and_ignored(events)]),
    ]
