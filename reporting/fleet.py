"""A fleet run's ``report.html`` (``engine run --replicas N --plot``): one offline page on how the router spread the
load.

Made from the fleet's own files (``summary.json`` with a row per replica, ``requests.csv`` with each
request's replica and prefix-cache hit, ``routes.csv`` with each routing decision): the fleet's
headline numbers and router, then per replica what it was sent and served and how busy it was, its
prefix-cache hit rate, its requests' TTFT and end-to-end latency, and how its share of the arrivals
grew over the run; the router's commonest reasons last.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from kvsched.reporting.charts import Chart, figure_layout
from kvsched.reporting.html import chart_html, classes_html, warnings_html, write_page


def fleet_charts(summary: dict, requests: pd.DataFrame, routes: pd.DataFrame) -> list[Chart]:
    """Load, prefix hits, latency and arrivals over time, a bar or line per replica."""
    rows = summary["replicas"]
    names = [r["replica"] for r in rows]
    load = go.Figure(
        [
            go.Bar(name="routed", x=names, y=[r["routed"] for r in rows]),
            go.Bar(name="finished", x=names, y=[r["finished"] for r in rows]),
        ]
    )
    load.add_trace(
        go.Scatter(
            name="busy (share of the run)", x=names, y=[100 * r["busy"] for r in rows], mode="markers+lines", yaxis="y2"
        )
    )
    figure_layout(
        load,
        yaxis_title="requests",
        yaxis2=dict(title="busy (%)", overlaying="y", side="right", range=[0, 100]),
        barmode="group",
    )
    hits = figure_layout(
        go.Figure([go.Bar(x=names, y=[100 * r["prefix_hit_rate"] for r in rows])]),
        yaxis_title="prompt tokens found cached (%)",
    )
    latency = go.Figure()
    for label, key, stat in (
        ("TTFT p50", "ttft_s", "p50"),
        ("TTFT p99", "ttft_s", "p99"),
        ("E2E p50", "e2e_s", "p50"),
        ("E2E p99", "e2e_s", "p99"),
    ):
        latency.add_trace(go.Bar(name=label, x=names, y=[r[key][stat] for r in rows]))
    figure_layout(latency, yaxis_title="seconds", barmode="group")
    arrivals = go.Figure()
    for name in names:
        mine = routes[routes.replica == name].sort_values("time")
        arrivals.add_trace(
            go.Scatter(name=name, x=mine.time, y=list(range(1, len(mine) + 1)), mode="lines", line_shape="hv")
        )
    figure_layout(arrivals, xaxis_title="time (s)", yaxis_title="requests routed so far")
    router = summary["fleet"]["router"]
    return [
        Chart(
            "load",
            "Load per replica",
            f"What router {router} sent each replica and what it finished (bars), and the share of the run it was "
            "busy (line): an even router gives even bars; a replica busy all along is the fleet's bottleneck.",
            load,
        ),
        Chart(
            "prefix-hits",
            "Prefix-cache hits per replica",
            "The share of each replica's prompt tokens its prefix cache held "
            f"(fleet: {100 * summary['prefix_hit_rate']:.1f}%): what a prefix-aware router buys.",
            hits,
        ),
        Chart(
            "latency",
            "Latency per replica",
            "TTFT of the requests whose prompt ran there, end-to-end of those it finished: "
            "a replica slower than the others was sent more than its share, or harder requests.",
            latency,
        ),
        Chart(
            "arrivals",
            "Routing over time",
            "Requests routed to each replica so far: where the lines part, the router "
            "favoured one replica over the others.",
            arrivals,
        ),
    ]


def write_fleet_report(directory: Path, path: Path) -> Path:
    """``report.html`` for the fleet's files under ``directory``, written to ``path`` (complete or not at all)."""
    summary = json.loads((directory / "summary.json").read_text())
    requests = pd.read_csv(directory / "requests.csv")
    routes = pd.read_csv(directory / "routes.csv", keep_default_na=False)
    fleet = summary["fleet"]
    charts = fleet_charts(summary, requests, routes)
    reasons = routes.reason.replace("", "(no reason given)").str.split(":").str[0].value_counts().head(8)
    heads = [
        ("router", f"{fleet['router']} · staleness {1000 * fleet['staleness_s']:g} ms"),
        ("replicas · policy · profile", f"{fleet['replicas']} · {summary['policy']} · {summary.get('profile', '?')}"),
        (
            "requests: finished / ignored / aborted",
            f"{summary['finished']:,} / {summary['ignored']:,} / {summary['aborted']:,}",
        ),
        ("throughput", f"{summary['requests_per_s']:.3g} req/s · {summary['throughput_tokens_per_s']:.4g} tok/s"),
        ("TTFT (s): mean / p50 / p99", " / ".join(f"{summary['ttft_s'][k]:.4g}" for k in ("mean", "p50", "p99"))),
        ("E2E (s): mean / p50 / p99", " / ".join(f"{summary['e2e_s'][k]:.4g}" for k in ("mean", "p50", "p99"))),
        ("prefix-cache hits (prompt tokens)", f"{100 * summary['prefix_hit_rate']:.1f}%"),
    ]
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in heads)
    why = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{n:,}</td></tr>" for k, n in reasons.items())
    title = f"kvsched fleet: {fleet['replicas']} replicas behind {fleet['router']}"
    return write_page(
        path,
        title,
        f"""{warnings_html(summary)}
<table id="fleet"><tr><th>metric</th><th>value</th></tr>{table}</table>
{classes_html(summary)}
{"".join(chart_html(c) for c in charts)}
<h2>The router's commonest reasons</h2>
<table id="reasons"><tr><th>reason</th><th>requests</th></tr>{why}</table>
<p class="caption">Each request's route and reason: \
<code>engine explain {html.escape(directory.name)} --request ID</code>;
{len(routes):,} routing decisions in routes.csv.</p>""",
        charts,
    )
