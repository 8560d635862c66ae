"""A self-contained ``report.html``: the summary as tables and the plots inlined as base64 PNGs."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

STYLE = """body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
td:first-child,th:first-child{text-align:left}img{max-width:100%;border:1px solid #eee;margin:.5em 0}
pre{background:#f6f6f6;padding:1em;overflow:auto;font-size:12px}"""


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _rows(summary: dict) -> list[tuple[str, str]]:
    rows = [
        ("policy", summary["policy"]), ("cost profile", summary.get("profile")),
        ("requests (finished / ignored / aborted)", f"{summary['finished']} / {summary['ignored']} / {summary['aborted']}"),
        ("simulated duration (s)", summary["duration_s"]), ("steps", summary["steps"]),
        ("throughput (req/s)", summary["requests_per_s"]), ("throughput (output tok/s)", summary["throughput_tokens_per_s"]),
    ]
    for key, label in (("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2e_s", "end-to-end (s)"), ("queueing_s", "queueing (s)")):
        d = summary[key]
        rows.append((f"{label} mean / p50 / p90 / p99", " / ".join(_fmt(d[k]) for k in ("mean", "p50", "p90", "p99"))))
    p = summary["preemptions"]
    rows.append(("preemptions (recompute / swap)", f"{p['recompute']} / {p['swap']}"))
    slo = summary.get("slo")
    if slo:
        rows.append((f"SLO goodput (TTFT ≤ {_fmt(slo['slo_ttft_s'])} s, TPOT ≤ {_fmt(slo['slo_tpot_s'])} s)",
                     f"{_fmt(slo['goodput_requests_per_s'])} req/s · {100 * slo['slo_attainment']:.1f}% of requests"))
    fair = summary.get("fairness")
    if fair and len(fair["tenants"]) > 1:
        rows.append(("fairness: Jain's index / max service gap", f"{_fmt(fair['jain_index'])} / {_fmt(fair['max_service_gap'])}"))
    kv = summary.get("kv_usage")
    if kv:
        rows.append(("GPU KV blocks: peak / mean utilisation", f"{kv['gpu_blocks_peak']} of {kv['gpu_blocks_total']} / {100 * kv['gpu_utilization_mean']:.1f}%"))
    rows.append(("leaked blocks", summary["leaked_blocks"]))
    return [(k, _fmt(v) if not isinstance(v, str) else html.escape(v)) for k, v in rows]


def write_report(summary: dict, pngs: list[Path], path: Path) -> Path:
    images = "\n".join(
        f'<h3>{html.escape(p.stem.replace("_", " "))}</h3><img alt="{html.escape(p.stem)}" '
        f'src="data:image/png;base64,{base64.b64encode(Path(p).read_bytes()).decode()}">'
        for p in pngs
    )
    table = "\n".join(f"<tr><td>{html.escape(k)}</td><td>{v}</td></tr>" for k, v in _rows(summary))
    doc = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvsched run: {html.escape(summary['policy'])}</title>
<style>{STYLE}</style></head><body>
<h1>kvsched simulation report</h1>
<table><tr><th>metric</th><th>value</th></tr>
{table}
</table>
{images}
<h2>summary.json</h2><pre>{html.escape(json.dumps(summary, indent=2))}</pre>
</body></html>
"""
    path.write_text(doc, encoding="utf-8")
    return path
