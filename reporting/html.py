"""``report.html``: one self-contained, interactive page per run (works offline: Plotly's JavaScript is inlined).

The run's warnings first (requests it did not serve, a queue that never emptied), the metrics
``vllm bench serve`` prints and those Vidur users read, the charts of
``reporting/charts.py`` with a caption under each, and a table of the requests that waited
longest, each linked to its ``engine explain --request`` view (on the page, under the table).
A script notes any JavaScript error in a banner at the top, and marks the page once every chart
has rendered (``data-charts-rendered`` on ``<body>``), which the browser test reads.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from kvsched.metrics.classes import class_table
from kvsched.metrics.inter_token import inter_token_latencies, weighted_percentiles
from kvsched.metrics.requests import distribution
from kvsched.metrics.warnings import warning_text
from kvsched.reporting.charts import DONE, Chart, all_charts
from kvsched.reporting.explain import Explainer
from kvsched.reporting.files import RunFiles

TABLE_ROWS = 100  # requests in the table (the longest waits), each with its explain view

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}.sub{color:#555;margin-top:0}
table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:3px 9px;text-align:right}
td:first-child,th:first-child{text-align:left}.chart{margin:1.5em 0 .3em}\
.caption{color:#444;font-size:14px;margin:0 0 2em;max-width:900px}
pre{background:#f6f6f6;padding:.8em;overflow:auto;font-size:12px}details{margin:.4em 0}\
summary{cursor:pointer;font-family:monospace}
#js-errors{background:#fdd;border:1px solid #c00;padding:.5em 1em}
.warnings{background:#fff4d6;border:1px solid #d9a400;padding:.4em 1em;margin:1em 0}.warnings li{margin:.2em 0}"""

SCRIPT = """const specs = JSON.parse(document.getElementById('chart-specs').textContent);
Promise.all(specs.map(id => {
  const fig = JSON.parse(document.getElementById('fig-' + id).textContent);
  return Plotly.newPlot(id, fig.data, fig.layout, {responsive: true, displaylogo: false});
})).then(() => { document.body.dataset.chartsRendered = String(specs.length); }, reportError);
for (const a of document.querySelectorAll('a.explain')) {
  a.addEventListener('click', () => { document.getElementById(a.hash.slice(1)).open = true; });
}"""

CATCH = """function reportError(e) {
  const box = document.getElementById('js-errors');
  box.hidden = false;
  box.textContent += 'JavaScript error: ' + (e && e.message ? e.message : e) + '\\n';
}
window.addEventListener('error', reportError);"""


def _fmt(v, scale: float = 1.0, digits: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return "–"
    """``v`` as text (escaped where it is shown)."""
    return format(v * scale, digits) if isinstance(v, (int, float, np.floating, np.integer)) else str(v)


def _dist(d: dict, scale: float = 1.0) -> str:
    return " / ".join(_fmt(d[k], scale) for k in ("mean", "p50", "p90", "p99"))


def metric_rows(run: RunFiles, itl: tuple[np.ndarray, np.ndarray]) -> list[tuple[str, str]]:
    """The summary table: vllm bench serve's metrics first, then Vidur's, then the engine's."""
    s, req = run.summary, run.requests
    done = req[req.status.isin(DONE)]
    duration = s["duration_s"]
    prompt_tokens = int(done.prompt_tokens.sum())
    w = s.get("workload", {})
    rows = [
        (
            "policy · workload · profile",
            f"{s['policy']} · {w.get('name') or w.get('kind', '?')} · {s.get('profile', '?')}",
        ),
        ("requests: finished / ignored / aborted", f"{s['finished']:,} / {s['ignored']:,} / {s['aborted']:,}"),
        ("duration (simulated s) · steps", f"{duration:,.1f} · {s['steps']:,}"),
        ("input tokens · generated tokens (finished requests)", f"{prompt_tokens:,} · {s['output_tokens']:,}"),
        ("request throughput (req/s)", _fmt(s["requests_per_s"])),
        ("output token throughput (tok/s)", _fmt(s["throughput_tokens_per_s"])),
        (
            "total token throughput (tok/s)",
            _fmt((prompt_tokens + s["output_tokens"]) / duration if duration > 0 else 0.0),
        ),
        ("TTFT (s): mean / p50 / p90 / p99", _dist(s["ttft_s"])),
        ("TPOT (ms): mean / p50 / p90 / p99", _dist(s["tpot_s"], 1000)),
        ("ITL (ms): mean / p50 / p90 / p99", _dist(weighted_percentiles(*itl), 1000)),
        ("E2E latency (s): mean / p50 / p90 / p99", _dist(s["e2e_s"])),
    ]
    slo = s.get("slo") or {}
    if slo.get("slo_ttft_s") is not None or slo.get("slo_tpot_s") is not None:
        rows.append(
            (
                f"goodput (TTFT ≤ {_fmt(slo['slo_ttft_s'])} s, TPOT ≤ {_fmt(slo['slo_tpot_s'], 1000)} ms)",
                f"{_fmt(slo['goodput_requests_per_s'])} req/s · {100 * slo['slo_attainment']:.1f}% of requests",
            )
        )
    per_token = (done.e2e / done.output_tokens.where(done.output_tokens > 0)).tolist()
    rows += [
        ("scheduling delay (s): mean / p50 / p90 / p99", _dist(s["queueing_s"])),
        (
            "latency per output token (ms): mean / p50 / p90 / p99",
            _dist(distribution([v for v in per_token if v == v]), 1000),
        ),
        ("preemptions: recompute / swap", f"{s['preemptions']['recompute']:,} / {s['preemptions']['swap']:,}"),
    ]
    tax = s.get("recompute")
    if tax:  # metrics/recompute.py
        rows.append(
            (
                "recompute tax: recomputed / computed tokens",
                f"{100 * tax['tax']:.1f}% · {tax['recomputed_tokens']:,} of "
                f"{tax['computed_tokens']:,} ({tax['discarded_tokens']:,} thrown away by preemptions)",
            )
        )
    kv = s.get("kv_usage")
    if kv:
        rows.append(
            (
                "GPU KV blocks: peak · mean use",
                f"{kv['gpu_blocks_peak']:,} of {kv['gpu_blocks_total']:,} · {100 * kv['gpu_utilization_mean']:.1f}%",
            )
        )
    fair = s.get("fairness")
    if fair and len(fair["tenants"]) > 1:
        rows.append(
            (
                "fairness: Jain's index · max service gap",
                f"{_fmt(fair['jain_index'])} · {_fmt(fair['max_service_gap'])}",
            )
        )
    rows.append(("leaked blocks", str(s["leaked_blocks"])))
    return rows


def classes_html(summary: dict) -> str:
    """The per-class table (``metrics/classes.py``: per SLO class, tenant, priority, over sessions), or nothing."""
    head, rows = class_table(summary)
    if not rows:
        return ""
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (
        "<h2>Per class</h2><table "
        f'id="classes"><tr>{"".join(f"<th>{html.escape(h)}</th>" for h in head)}</tr>{cells}</table><p '
        'class="caption">Each SLO class, tenant and priority of the run (where it has more than one), and over its '
        "sessions the distribution of each session's mean TTFT: a tiered or session-aware policy moves each its own "
        "way.</p>"
    )


def warnings_html(summary: dict) -> str:
    """The run's warnings (``metrics/warnings.py``) in a box above the table, or nothing."""
    items = "".join(
        f"<li>{html.escape(warning_text(w, summary['num_requests']))}</li>" for w in summary.get("warnings") or ()
    )
    return (
        '<div class="warnings" id="warnings"><strong>Warnings: these results are not all they '
        f"seem.</strong><ul>{items}</ul></div>"
        if items
        else ""
    )


def in_script(json_text: str) -> str:
    """JSON text to inline in a ``<script>`` element: each ``<``, ``>`` and ``&`` as its ``\\u`` escape, which
    ``JSON.parse`` reads back as it was, so that nothing a path or a label holds (``</script>``, ``<!--<script>``,
    which sends the HTML parser into a state where the element's end is not its end) can cut the element short."""
    return json_text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def chart_html(chart: Chart) -> str:
    spec = in_script(chart.figure.to_json())
    return (
        f'<h3>{html.escape(chart.title)}</h3><div class="chart" id="{chart.key}"></div>'
        f'<p class="caption">{html.escape(chart.caption)}</p>'
        f'<script type="application/json" id="fig-{chart.key}">{spec}</script>'
    )


def _request_table(ex: Explainer) -> str:
    req = ex.run.requests
    shown = req.dropna(subset=["queueing_time"]).nlargest(TABLE_ROWS, "queueing_time")
    heads = (
        "request",
        "arrival (s)",
        "scheduling delay (s)",
        "TTFT (s)",
        "TPOT (ms)",
        "E2E (s)",
        "prompt",
        "output",
        "preemptions",
        "status",
    )
    rows, views = [], []
    for i, r in enumerate(shown.itertuples()):
        anchor = f"explain-{i}"
        cells = [
            _fmt(r.arrival_time, digits=",.3f"),
            _fmt(r.queueing_time, digits=",.3f"),
            _fmt(r.ttft, digits=",.3f"),
            _fmt(r.tpot, 1000, ",.1f"),
            _fmt(r.e2e, digits=",.3f"),
            f"{r.prompt_tokens:,}",
            f"{r.output_tokens:,}",
            f"{r.preemptions_recompute + r.preemptions_swap:,}",
            r.status,
        ]
        link = f'<a class="explain" href="#{anchor}">{html.escape(r.request_id)}</a>'
        rows.append(f"<tr><td>{link}</td>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        text = "\n".join(ex.request(r.request_id))
        views.append(
            f'<details id="{anchor}"><summary>engine explain {html.escape(ex.run.directory.name)} --request '
            f"{html.escape(r.request_id)}</summary><pre>{html.escape(text)}</pre></details>"
        )
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>"
    return (
        f"<table>{head}{''.join(rows)}</table>"
        f'<p class="caption">The {len(shown):,} requests with the longest scheduling delay (of {len(req):,}). Each '
        "links to its explain view below: its phases, each wait with its reasons and step numbers, its preemptions "
        "and what it waited behind. <code>engine explain DIR --request ID</code> prints the same for any request.</p>"
        + "".join(views)
    )


def write_report(run: RunFiles, path: Path) -> Path:
    """Write ``path`` from a results folder read back (``read_run``): summary, charts, requests."""
    ex = Explainer(run)
    itl = inter_token_latencies(run.events, run.steps)
    s = run.summary
    sections = all_charts(s, run.requests, run.steps, run.events, ex.why, itl)
    charts = [c for _, cs in sections for c in cs]
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in metric_rows(run, itl))
    body = "".join(f"<h2>{html.escape(title)}</h2>" + "".join(chart_html(c) for c in cs) for title, cs in sections)
    knobs = ", ".join(
        f"{k}={v}" for k, v in s["config"].items() if v is not None and k not in ("audit_every_step", "decode_lane")
    )
    return write_page(
        path,
        f"kvsched run: {s['policy']}",
        f"""<p class="sub">{html.escape(knobs)}</p>
{warnings_html(s)}
<table><tr><th>metric</th><th>value</th></tr>{table}</table>
{classes_html(s)}
{body}
<h2>Requests that waited longest</h2>
{_request_table(ex)}
<h2>summary.json</h2><details><summary>the run's summary as written</summary>\
<pre>{html.escape(json.dumps(s, indent=2))}</pre></details>""",
        charts,
    )


def write_page(path: Path, title: str, body: str, charts: list[Chart]) -> Path:
    """A page that works offline (Plotly's JavaScript inlined) under ``title``, holding ``body`` and drawing its
    ``charts`` (``chart_html``); written whole or not at all."""
    import plotly.offline

    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style><script>{CATCH}</script><script>{plotly.offline.get_plotlyjs()}</script></head><body>
<div id="js-errors" hidden></div>
<h1>{html.escape(title)}</h1>
{body}
<script type="application/json" id="chart-specs">{in_script(json.dumps([c.key for c in charts]))}</script>
<script>{SCRIPT}</script>
</body></html>
"""
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(doc, encoding="utf-8")
    tmp.replace(path)
    return path
