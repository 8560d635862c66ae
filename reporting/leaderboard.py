"""The leaderboard's files: ``leaderboard.json``, ``leaderboard.md`` and ``leaderboard.html``, all made from
the one JSON document (``experiments.leaderboard.board_json``) and published together, atomically.

The page is one file that works offline: the document inlined, a few lines of JavaScript that draw
the table, sort it by any column (click a heading) and show one metric or all. The state is also
read from the address (``#metric=KEY&sort=COLUMN&dir=asc``), so that a link (and the browser test,
which cannot click) opens the board as someone left it. Like ``report.html`` it notes a JavaScript
error in a banner, and marks ``<body data-rendered=N>`` once the N rows are drawn.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from kvsched.experiments.evidence import statistics_note
from kvsched.reporting.destination import publishing_folder
from kvsched.reporting.html import CATCH, STYLE, in_script

BOARD_FILES = ("leaderboard.json", "leaderboard.md", "leaderboard.html")


def heading(metric: dict[str, Any]) -> str:
    return f"{metric['label']} ({metric['unit']})" if metric["unit"] else metric["label"]


def _cells(doc: dict) -> dict[tuple[str, str, str], dict]:
    return {(c["workload"], c["policy"], c["metric"]): c for c in doc["cells"]}


def seeds_text(doc: dict) -> str:
    """Each workload's seeds; one seed is one run (a trace at its own arrival times runs once, whatever ``--seeds``)."""
    return "; ".join(
        f"{w['key']}: "
        + (
            f"seeds {', '.join(map(str, w['seeds']))}"
            if len(w["seeds"]) > 1
            else f"seed {w['seeds'][0]} (one run, so no interval)"
        )
        for w in doc["workloads"]
    )


def warnings(doc: dict) -> list[str]:
    """One line per workload whose runs warned (``metrics/warnings.py``: requests ignored, a queue that
    never emptied): each distinct warning once, whichever policies and seeds it came from."""
    lines = []
    for w in doc["workloads"]:
        seen = sorted({text for c in doc["cells"] if c["workload"] == w["key"] for text in c["warnings"]})
        if seen:
            lines.append(f"Warnings on {w['key']} (over its runs): {'; '.join(seen)}.")
    return lines


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(map(_md_cell, head)) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(map(_md_cell, r)) + " |" for r in rows),
    ]


def _md_cell(text: str) -> str:
    """``text`` as one cell of a Markdown table: on one line, its pipes escaped (a path or a label may hold either)."""
    return " ".join(text.split()).replace("|", "\\|")


def _by_rank(ranks: dict[str, dict], policies: list[str]) -> list[str]:
    return sorted(policies, key=lambda p: (ranks[p]["best"], ranks[p]["worst"]))


def markdown(doc: dict) -> str:
    """A table per workload (rows the policies by rank: rank, the primary metric's paired change against the
    baseline, each metric's mean and interval, the best of each column in bold), then every workload together."""
    cells, metrics, base = _cells(doc), doc["metrics"], doc["baseline"]
    primary = next(m for m in metrics if m["key"] == doc["primary"])
    lines: list[str] = []
    for w in doc["workloads"]:
        key, ranks = w["key"], doc["ranks"][w["key"]]
        head = ["policy", "rank", f"{primary['label']} vs {base}", *map(heading, metrics)]
        rows = []
        for p in _by_rank(ranks, doc["policies"]):
            change = cells[(key, p, primary["key"])]["change"]
            row = [f"`{p}`", ranks[p]["text"], change["text"] if change else "baseline"]
            for m in metrics:
                text = cells[(key, p, m["key"])]["text"]
                row.append(f"**{text}**" if p in doc["best"][key][m["key"]] else text)
            rows.append(row)
        for entry in (e for e in doc["measured"] if e["workload"] == key):
            rows.append([f"{entry['label']} (measured)", "–", "–", *(entry["texts"][m["key"]] for m in metrics)])
        lines += [f"**{key}** ({_seeds(w)})", "", *_table(head, rows), ""]
    if len(doc["workloads"]) > 1:
        ranks = doc["overall"]["ranks"]
        head = ["policy", "rank", *(f"{heading(m)} vs {base}" for m in metrics)]
        rows = [
            [f"`{p}`", ranks[p]["text"], *(_change_text(doc["overall"]["changes"][p][m["key"]]) for m in metrics)]
            for p in _by_rank(ranks, doc["policies"])
        ]
        lines += [
            f"**every workload** (paired over {doc['overall']['units']} runs: each workload at each seed)",
            "",
            *_table(head, rows),
            "",
        ]
    seeds = seeds_text(doc)
    settings = ", ".join(f"{k}={v}" for k, v in doc["settings"].items())
    notes = [
        f"Each cell: the mean over the seeds and its {round(100 * doc['level'])}% interval; rank by "
        f"{heading(primary)}, {primary['better']} is better; the best of each column in bold. "
        f"{statistics_note(doc['level'])} {seeds}. Profile "
        f"{doc['profile']}{f'; settings {settings}' if settings else ''}.",
        "",
        f"`{doc['command']}`",
    ]
    notes[1:1] = [line for text in warnings(doc) for line in ("", text)]
    if doc["measured"]:
        notes.insert(
            1,
            "A measured row is one replay against the served engine, timed from the client (engine bench); it is not "
            "ranked.",
        )
    return "\n".join(lines) + "\n" + "\n".join(notes) + "\n"


def _seeds(workload: dict) -> str:
    seeds = workload["seeds"]
    return f"seeds {seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}: one run, no interval"


def _change_text(change: dict | None) -> str:
    return change["text"] if change else "baseline"


PAGE_STYLE = """th{cursor:pointer;user-select:none}th[aria-sort=ascending]::after{content:" ▲"}\
th[aria-sort=descending]::after{content:" ▼"}
td.best{font-weight:bold}tr.measured td{font-style:italic;background:#f4f8ff}.controls{margin:1em 0}"""

# Draws the table from the inlined document; sorting and the metric shown come from the address or the
# controls, and every change is written back to the address.
PAGE_SCRIPT = """const doc = JSON.parse(document.getElementById('board').textContent);
const byKey = new Map(doc.cells.map(c => [c.workload + '\\u0000' + c.policy + '\\u0000' + c.metric, c]));
const primary = doc.metrics.find(m => m.key === doc.primary);
const several = doc.workloads.length > 1;
const state = Object.assign({metric: '', sort: 'rank:' + (several ? '*' : doc.workloads[0].key), dir: 'asc'},
  Object.fromEntries(new URLSearchParams(location.hash.slice(1))));
const rankValue = r => r.best + r.worst / 1000;
function columns() {
  const cols = [{id: 'policy', head: 'policy'}];
  for (const w of doc.workloads) {
    cols.push({id: 'rank:' + w.key, head: w.key + ' rank'});
    cols.push({id: 'change:' + w.key, head: w.key + ' ' + primary.label + ' vs ' + doc.baseline});
    for (const m of doc.metrics) if (!state.metric || state.metric === m.key)
      cols.push({id: w.key + '|' + m.key, head: w.key + ' ' + m.label + (m.unit ? ' (' + m.unit + ')' : '')});
  }
  if (several) {
    cols.push({id: 'rank:*', head: 'every workload rank'});
    cols.push({id: 'change:*', head: 'every workload ' + primary.label + ' vs ' + doc.baseline});
  }
  return cols;
}
function changeCell(change) {
  return change ? {value: change.value, text: change.text} : {value: null, text: 'baseline'};
}
function rows() {
  const out = doc.policies.map(p => ({policy: p, measured: false, cells: {}}));
  for (const r of out) {
    for (const w of doc.workloads) {
      const rank = doc.ranks[w.key][r.policy];
      r.cells['rank:' + w.key] = {value: rankValue(rank), text: rank.text};
      r.cells['change:' + w.key] = changeCell(byKey.get(w.key + '\\u0000' + r.policy + '\\u0000' + doc.primary).change);
      for (const m of doc.metrics) {
        const c = byKey.get(w.key + '\\u0000' + r.policy + '\\u0000' + m.key);
        r.cells[w.key + '|' + m.key] = {value: c ? c.mean : null, text: c ? c.text : '\\u2013', \
best: doc.best[w.key][m.key].includes(r.policy)};
      }
    }
    if (several) {
      const rank = doc.overall.ranks[r.policy];
      r.cells['rank:*'] = {value: rankValue(rank), text: rank.text};
      r.cells['change:*'] = changeCell(doc.overall.changes[r.policy][doc.primary]);
    }
  }
  for (const e of doc.measured) {
    const r = {policy: e.label + ' (measured)', measured: true, cells: {}};
    for (const m of doc.metrics) r.cells[e.workload + '|' + m.key] = {value: e.metrics[m.key], text: e.texts[m.key]};
    out.push(r);
  }
  return out;
}
function value(r, id) { return id === 'policy' ? r.policy : (r.cells[id] ? r.cells[id].value : null); }
function draw() {
  const cols = columns();
  if (!cols.some(c => c.id === state.sort)) state.sort = 'policy';
  const sign = state.dir === 'desc' ? -1 : 1;
  const list = rows().sort((a, b) => {
    const x = value(a, state.sort), y = value(b, state.sort);
    if (x === null || x === undefined) return (y === null || y === undefined) ? 0 : 1;  // no number: last either way
    if (y === null || y === undefined) return -1;
    return sign * (typeof x === 'string' ? x.localeCompare(y) : x - y);
  });
  const table = document.getElementById('leaderboard');
  table.replaceChildren();
  const head = table.insertRow();
  for (const c of cols) {
    const th = document.createElement('th');
    th.textContent = c.head;
    th.dataset.column = c.id;
    if (c.id === state.sort) th.setAttribute('aria-sort', state.dir === 'desc' ? 'descending' : 'ascending');
    th.addEventListener('click', () => {
      state.dir = state.sort === c.id && state.dir === 'asc' ? 'desc' : 'asc';
      state.sort = c.id;
      update();
    });
    head.appendChild(th);
  }
  for (const r of list) {
    const tr = table.insertRow();
    tr.dataset.policy = r.policy;
    if (r.measured) tr.className = 'measured';
    for (const c of cols) {
      const td = tr.insertCell();
      const cell = c.id === 'policy' ? {text: r.policy} : (r.cells[c.id] || {text: '\\u2013'});
      td.textContent = cell.text;
      if (cell.best) td.className = 'best';
    }
  }
  document.body.dataset.rendered = String(list.length);
  document.body.dataset.sorted = state.sort + ':' + state.dir;
}
function update() {
  history.replaceState(null, '', '#' + new URLSearchParams(state).toString());
  draw();
}
const pick = document.getElementById('metric');
for (const m of doc.metrics) pick.add(new Option(m.label + (m.unit ? ' (' + m.unit + ')' : ''), m.key));
pick.value = state.metric;
pick.addEventListener('change', () => { state.metric = pick.value; update(); });
draw();"""


def page(doc: dict) -> str:
    """``leaderboard.html``: the document inlined, drawn and sorted by ``PAGE_SCRIPT``."""
    data = in_script(json.dumps(doc, allow_nan=False))
    primary = next(m for m in doc["metrics"] if m["key"] == doc["primary"])
    seeds = html.escape(seeds_text(doc))
    measured = " A measured row is one replay against the served engine, not ranked." if doc["measured"] else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvsched leaderboard</title>
<style>{STYLE}
{PAGE_STYLE}</style><script>{CATCH}</script></head><body>
<div id="js-errors" hidden></div>
<h1>kvsched leaderboard</h1>
<p class="sub">{len(doc["policies"])} policies × {len(doc["workloads"])} workloads · {seeds} · \
profile {html.escape(doc["profile"])}
· ranked by {html.escape(heading(primary))} ({primary["better"]} is better)</p>
<div class="controls"><label>metric <select id="metric"><option value="">all</option></select></label>
(click a heading to sort by it; again to reverse)</div>
<table id="leaderboard"></table>
<p class="caption">Each cell: the mean over the seeds and its {round(100 * doc["level"])}% interval; \
the best of each column in bold;
baseline {html.escape(doc["baseline"])}. {html.escape(statistics_note(doc["level"]))}{measured}</p>
{"".join(f'<p class="caption warnings">{html.escape(text)}</p>' for text in warnings(doc))}
<p class="caption">Made by <code>{html.escape(doc["command"])}</code> \
(kvsched {html.escape(doc["versions"]["kvsched"])}).</p>
<script type="application/json" id="board">{data}</script>
<script>{PAGE_SCRIPT}</script>
</body></html>
"""


def write_board(doc: dict, directory: Path) -> list[Path]:
    """The three files under ``directory``, published together (``reporting/destination.py``)."""
    with publishing_folder(directory, BOARD_FILES) as stage:
        (stage / "leaderboard.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        (stage / "leaderboard.md").write_text(markdown(doc), encoding="utf-8")
        (stage / "leaderboard.html").write_text(page(doc), encoding="utf-8")
    return [Path(directory) / name for name in BOARD_FILES]
