"""``engine leaderboard`` end to end: a tiny board's three files, its cells and ranking equal to what
``engine compare`` says for the same runs, measured rows from a served engine, bad input as one line
and exit 2, and the page in headless Chromium (drawn, sorted from its address)."""

from __future__ import annotations

import csv
import html
import json
import math
import re
import shutil
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from test_bench_hostile import Liar
from test_report_browser import CHROMIUM, chromium

ENGINE = str(Path(sys.executable).parent / "engine")
TINY = [
    "-p",
    "vllm-default",
    "-p",
    "vllm-v1",
    "-p",
    "vllm-v1:policy=priority",
    "-w",
    "sharegpt@6",
    "--seeds",
    "2",
    "-n",
    "30",
    "-j",
    "1",
    "--baseline",
    "vllm-v1",
    "--set",
    "max_num_seqs=32",
]


def engine(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("board") / "out"
    done = engine("leaderboard", "-q", *TINY, "-o", out)
    assert done.returncode == 0, done.stderr
    return out


def _tables(md: str) -> dict[str, dict[str, list[str]]]:
    """The Markdown's tables by the bold line before each: {title: {column heading: [cells, top to bottom]}}."""
    tables, title, head = {}, None, None
    for line in md.splitlines():
        if line.startswith("**"):
            title, head = line.split("**")[1], None
        elif line.startswith("| ") and title is not None:
            cells = [c.strip(" `*") for c in line.strip("|").split(" | ")]
            if head is None:
                head = cells
                tables[title] = {h: [] for h in head}
            else:
                for h, c in zip(head, cells):
                    tables[title][h].append(c)
    return tables


def test_the_three_files_and_every_cell(board):
    assert sorted(p.name for p in board.iterdir()) == ["leaderboard.html", "leaderboard.json", "leaderboard.md"]
    doc = json.loads((board / "leaderboard.json").read_text())
    assert doc["command"].startswith("engine leaderboard -q -p vllm-default") and doc["versions"]["kvsched"]
    assert doc["workloads"][0]["seeds"] == [0, 1] and doc["primary"] == "ttft_mean_s" and doc["baseline"] == "vllm-v1"
    assert doc["policies"] == ["vllm-default", "vllm-v1", "vllm-v1:policy=priority"] and doc["settings"] == {
        "max_num_seqs": "32"
    }
    assert doc["options"]["vllm-v1:policy=priority"] == {"policy": "priority"}
    assert len(doc["cells"]) == 3 * 7  # policies × metrics, one workload
    for cell in doc["cells"]:
        if cell["mean"] is not None:
            assert cell["n"] == 2 and len(cell["values"]) == 2
            assert 0 <= cell["low"] <= cell["mean"] <= cell["high"]  # log-transformed: never below zero
        assert (cell["change"] is None) == (cell["policy"] == "vllm-v1" or cell["mean"] is None)
    tables = _tables((board / "leaderboard.md").read_text())
    table = tables["sharegpt@6"]
    assert list(table)[:3] == ["policy", "rank", "TTFT mean vs vllm-v1"] and "not served (%)" in table
    assert set(table["policy"]) == {"vllm-default", "vllm-v1", "vllm-v1:policy=priority"}
    assert table["TTFT mean vs vllm-v1"][table["policy"].index("vllm-v1")] == "baseline"
    best = doc["best"]["sharegpt@6"]["ttft_mean_s"]
    line = next(x for x in (board / "leaderboard.md").read_text().splitlines() if x.startswith(f"| `{best[0]}` |"))
    assert line.split(" | ")[3].startswith("**")  # the best of the column in bold


def test_cells_changes_and_ranking_are_what_compare_says_for_the_same_runs(board, tmp_path):
    done = engine(
        "compare",
        "-q",
        "-p",
        "vllm-default",
        "-p",
        "vllm-v1",
        "-p",
        "vllm-v1:policy=priority",
        "-w",
        "sharegpt",
        "--rate",
        "6",
        "--seeds",
        "2",
        "-n",
        "30",
        "--set",
        "max_num_seqs=32",
        "-o",
        tmp_path / "cmp",
    )
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "cmp" / "comparison.csv") as f:
        compared = {row["metric"]: row for row in csv.DictReader(f)}
    table = _tables((board / "leaderboard.md").read_text())["sharegpt@6"]
    at = {p: i for i, p in enumerate(table["policy"])}
    for label in (
        "TTFT mean (s)",
        "TTFT p99 (s)",
        "E2E p99 (s)",
        "throughput (tok/s)",
        "recompute tax (%)",
        "not served (%)",
    ):
        for policy in at:
            assert table[label][at[policy]] == compared[label][policy], (label, policy)
    for policy in ("vllm-default", "vllm-v1:policy=priority"):
        assert table["TTFT mean vs vllm-v1"][at[policy]] == compared["TTFT mean (s)"][f"{policy} vs vllm-v1"]
        assert table["rank"][at[policy]] == compared["rank by TTFT mean (s)"][policy]
    doc = json.loads((board / "leaderboard.json").read_text())
    mean = {p: float(compared["TTFT mean (s)"][p].split(" ")[0]) for p in at}
    assert mean["vllm-default"] != mean["vllm-v1"]
    ranks = doc["ranks"]["sharegpt@6"]
    assert table["policy"] == sorted(at, key=lambda p: (ranks[p]["best"], ranks[p]["worst"]))


def test_every_workload_together_is_paired_over_each_workload_and_seed(tmp_path):
    out = tmp_path / "two"
    done = engine(
        "leaderboard",
        "-q",
        "-p",
        "vllm-v1",
        "-p",
        "sjf-aging",
        "-w",
        "sharegpt@6",
        "-w",
        "synthetic@30",
        "--seeds",
        "2",
        "-n",
        "40",
        "-j",
        "1",
        "-o",
        out,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "leaderboard.json").read_text())
    assert doc["overall"]["units"] == 4 and doc["baseline"] == "vllm-v1"
    pooled = doc["overall"]["changes"]["sjf-aging"]["ttft_mean_s"]
    per_seed = [c for c in doc["cells"] if c["policy"] == "sjf-aging" and c["metric"] == "ttft_mean_s"]
    base = [c for c in doc["cells"] if c["policy"] == "vllm-v1" and c["metric"] == "ttft_mean_s"]
    ratios = [v / b for c, d in zip(per_seed, base) for v, b in zip(c["values"], d["values"])]
    assert pooled["n"] == 4 and pooled["value"] == pytest.approx(math.prod(ratios) ** 0.25)
    assert "**every workload** (paired over 4 runs" in (out / "leaderboard.md").read_text()


BAD = [
    (["-w", "no-such-workload"], "no-such-workload"),
    (["--metric", "ttft_p42_s"], "unknown --metric 'ttft_p42_s'"),
    (["--rank-by", "tpot_p99_s"], "--rank-by tpot_p99_s: rank by one of the board's --metric columns"),
    (["-w", "sharegpt@fast"], "after @ comes a rate"),
    (["-p", "vllm-v1", "-p", "vllm-v1"], "--policy vllm-v1 given twice"),
    (["-p", "lcf:victim=nobody"], "victim must be one of"),
    (["-p", "lcf", "--policy-opt", "lcf.nothing=1"], "unexpected keyword argument 'nothing'"),
    (["-p", "lcf", "--baseline", "hrrn"], "--baseline 'hrrn' is not one of the contenders"),
    (["--set", "max_num_seqs=many"], "max_num_seqs"),
    (["-o", "{file}"], "is a file, not a folder"),
    (["-o", "{file}/below"], "is a file, so nothing can be written under it"),
    (
        ["-p", "vllm-v1", "--real", "http://127.0.0.1:9"],
        "cannot reach an OpenAI-compatible server at http://127.0.0.1:9",
    ),
]


def test_bad_input_is_one_line_and_exit_2_before_any_run(tmp_path):
    """Through the installed command once; the other cases in this process (each start of the CLI costs seconds)."""
    from typer.testing import CliRunner

    from kvsched.cli.app import app

    done = engine("leaderboard", "-q", "-p", "no-such-policy", "-o", tmp_path / "out", timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "no-such-policy" in done.stderr, (
        done.stderr
    )
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args, message in BAD:
        out = [] if "-o" in args else ["-o", str(tmp_path / "out")]
        result = CliRunner().invoke(
            app, ["leaderboard", "-q", "-n", "5", "--seeds", "1", *[a.format(file=afile) for a in args], *out]
        )
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, (args, result.stderr)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]  # nothing written


def test_real_adds_a_measured_row_from_a_served_engine(tmp_path):
    Liar.counts, Liar.reasons = iter(lambda: None, 0), iter(lambda: "length", 0)  # honest: every token it streams
    Liar.acts, Liar.context = iter(lambda: "answer", 0), None
    server = ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    spec = tmp_path / "six.json"
    spec.write_text(
        json.dumps(
            {
                "kind": "synthetic",
                "num_requests": 6,
                "arrivals": {"kind": "poisson", "rate": 200.0},
                "prompt": {"kind": "lognormal", "median": 8, "sigma": 0.1, "max": 16},
                "output": {"kind": "lognormal", "median": 8, "sigma": 0.1, "max": 12},
            }
        )
    )
    try:
        done = engine(
            "leaderboard",
            "-q",
            "-p",
            "vllm-v1",
            "-w",
            spec,
            "--seeds",
            "1",
            "-j",
            "1",
            "-o",
            tmp_path / "out",
            "--real",
            f"http://127.0.0.1:{server.server_address[1]}",
            "--label",
            "served-v1",
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "out" / "leaderboard.json").read_text())
    (measured,) = doc["measured"]
    assert measured["label"] == "served-v1" and measured["finished"] == 6 and measured["metrics"]["ttft_mean_s"] > 0
    assert measured["metrics"]["recompute_tax"] is None  # a client cannot see inside the engine
    assert "| served-v1 (measured) | – |" in (tmp_path / "out" / "leaderboard.md").read_text()


def test_real_against_a_server_that_sends_headers_and_then_nothing_ends_after_the_timeout(tmp_path):
    """The client once waited an hour for each request."""
    Liar.counts, Liar.reasons, Liar.acts, Liar.context = (
        iter(lambda: None, 0),
        iter(lambda: "length", 0),
        iter(lambda: "hang", 0),
        None,
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        done = engine(
            "leaderboard",
            "-q",
            "-p",
            "fcfs",
            "-w",
            "sharegpt@6",
            "-n",
            "3",
            "--seeds",
            "1",
            "-j",
            "1",
            "-o",
            tmp_path / "out",
            "--real",
            f"http://127.0.0.1:{server.server_address[1]}",
            "--timeout",
            "1",
            timeout=120,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    (measured,) = json.loads((tmp_path / "out" / "leaderboard.json").read_text())["measured"]
    assert measured["finished"] == 0 and measured["aborted"] == 3


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_the_page_renders_the_table_and_sorts_in_headless_chromium(board, tmp_path):
    page = board / "leaderboard.html"
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page.read_text(), flags=re.S)
    assert "<script src" not in page.read_text() and not re.search(r"""(src|href)=["']https?:""", markup)
    order = {}
    for direction in ("asc", "desc"):
        proc = chromium(
            tmp_path,
            "--dump-dom",
            page.as_uri() + f"#metric=ttft_mean_s&sort=sharegpt%406%7Cttft_mean_s&dir={direction}",
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        dom = proc.stdout
        assert 'data-rendered="3"' in dom and f'data-sorted="sharegpt@6|ttft_mean_s:{direction}"' in dom
        assert re.search(r'<div id="js-errors" hidden="">\s*</div>', dom), "the page caught a JavaScript error"
        assert "E2E p99" not in dom.split('id="leaderboard"')[1].split("</table>")[0]  # one metric chosen
        order[direction] = re.findall(r'<tr data-policy="([^"]+)"', dom)
    doc = json.loads((board / "leaderboard.json").read_text())
    mean = {c["policy"]: c["mean"] for c in doc["cells"] if c["metric"] == "ttft_mean_s"}
    assert sorted(order["asc"]) == ["vllm-default", "vllm-v1", "vllm-v1:policy=priority"]
    assert [mean[p] for p in order["asc"]] == sorted(mean.values()) and [mean[p] for p in order["desc"]] == sorted(
        mean.values(), reverse=True
    )


def test_a_workload_names_its_rate_or_its_rate_scale():
    from kvsched.experiments.leaderboard import BoardWorkload

    assert BoardWorkload.parse("sharegpt@6").options(None, 3) == {
        "workload": "sharegpt",
        "num_requests": 200,
        "rate": 6.0,
        "rate_scale": 1.0,
        "seed": 3,
    }
    assert BoardWorkload.parse("azure-conv@x1.5", rate=None).options(50, 0)["rate_scale"] == 1.5
    assert BoardWorkload.parse("spec.json").options(None, 0)["num_requests"] is None  # a spec keeps its own count
    for bad in ("sharegpt@0", "sharegpt@xinf", "@6"):
        with pytest.raises(ValueError, match="--workload"):
            BoardWorkload.parse(bad)


# A DOM just large enough for the page's script: what it draws, and what a click on a heading does.
FAKE_DOM = r"""
const fs = require('fs');
const page = fs.readFileSync(process.argv[2], 'utf8');
const data = page.match(/<script type="application\/json" id="board">([\s\S]*?)<\/script>/)[1];
const scripts = [...page.matchAll(/<script>([\s\S]*?)<\/script>/g)].map(m => m[1]);
function el(tag) {
  return {tag, children: [], dataset: {}, attrs: {}, className: '', textContent: '', listeners: {}, value: '',
    replaceChildren() { this.children = []; }, insertRow() { const r = el('tr'); this.children.push(r); return r; },
    insertCell() { const c = el('td'); this.children.push(c); return c; }, appendChild(c) { this.children.push(c); },
    setAttribute(k, v) { this.attrs[k] = v; }, addEventListener(k, f) { this.listeners[k] = f; },
    add(o) { this.children.push(o); }};
}
const els = {board: {textContent: data}, leaderboard: el('table'), metric: el('select')};
global.document = {getElementById: id => els[id], createElement: el, body: {dataset: {}}};
global.location = {hash: process.argv[3]};
global.history = {replaceState(a, b, h) { location.hash = h; }};
global.Option = function (t, v) { this.text = t; this.value = v; };
eval(scripts[scripts.length - 1]);
const table = () => els.leaderboard.children.map(r => r.children.map(c => c.textContent));
const out = {first: table(), sorted: document.body.dataset.sorted};
els.leaderboard.children[0].children.find(c => c.dataset.column === process.argv[4]).listeners.click();
out.clicked = table(); out.hash = location.hash;
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")
def test_the_page_script_draws_and_sorts_under_node(board, tmp_path):
    """Where Chromium is absent: the page's own script run under Node on a minimal DOM."""
    script = tmp_path / "dom.js"
    script.write_text(FAKE_DOM)
    column = "sharegpt@6|ttft_mean_s"
    done = subprocess.run(
        [
            "node",
            str(script),
            str(board / "leaderboard.html"),
            "#metric=ttft_mean_s&sort=rank%3Asharegpt%406&dir=asc",
            column,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    doc = json.loads((board / "leaderboard.json").read_text())
    assert got["first"][0] == [
        "policy",
        "sharegpt@6 rank",
        "sharegpt@6 TTFT mean vs vllm-v1",
        "sharegpt@6 TTFT mean (s)",
    ]
    assert got["sorted"] == "rank:sharegpt@6:asc"
    ranks = doc["ranks"]["sharegpt@6"]
    assert [row[0] for row in got["first"][1:]] == sorted(ranks, key=lambda p: (ranks[p]["best"], ranks[p]["worst"]))
    table = _tables((board / "leaderboard.md").read_text())["sharegpt@6"]
    md = dict(zip(table["policy"], zip(table["rank"], table["TTFT mean vs vllm-v1"], table["TTFT mean (s)"])))
    assert {row[0]: tuple(row[1:]) for row in got["first"][1:]} == md  # the page shows the Markdown's numbers
    means = [float(row[3].split(" ")[0]) for row in got["clicked"][1:]]
    assert means == sorted(means) and "sort=sharegpt%406%7Cttft_mean_s" in got["hash"] and "dir=asc" in got["hash"]


def test_a_named_trace_spec_is_cut_to_the_boards_default_count():
    """sharegpt-4k is a spec of a 30,731-request trace: without -n the board ran all of them (a board of hours)."""
    from kvsched.experiments.leaderboard import DEFAULT_REQUESTS, BoardWorkload

    assert BoardWorkload.parse("sharegpt-4k@2.5").options(None, 0)["num_requests"] == DEFAULT_REQUESTS
    assert BoardWorkload.parse("tiered-sessions").options(None, 0)["num_requests"] is None  # its own 100 sessions


HOSTILE_NAME = "<!--<script>&amp;"  # a comment opener then a script tag: the HTML parser's "double-escaped" state


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_paths_and_labels_that_hold_markup_leave_the_page_whole_in_headless_chromium(tmp_path):
    """A workload path holding <!--<script> once broke the page's script: its inlined JSON no longer parsed."""
    folder = tmp_path / f"w{HOSTILE_NAME}"
    folder.mkdir()
    spec = folder / f"load{HOSTILE_NAME}.json"
    spec.write_text(
        json.dumps(
            {
                "kind": "synthetic",
                "num_requests": 6,
                "arrivals": {"kind": "poisson", "rate": 50.0},
                "prompt": {"kind": "fixed", "value": 30},
                "output": {"kind": "fixed", "value": 5},
            }
        )
    )
    policy = folder / "policy.py"
    policy.write_text("from kvsched.policies.fcfs import Fcfs\n\n\nclass Mine(Fcfs):\n    pass\n")
    done = engine(
        "leaderboard",
        "-q",
        "-p",
        "fcfs",
        "-p",
        f"{policy}:Mine",
        "-w",
        spec,
        "--seeds",
        "1",
        "-j",
        "1",
        "-o",
        tmp_path / "out",
    )
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "leaderboard.html").read_text()
    assert HOSTILE_NAME not in page.split('id="board">')[1].split("</script>")[0]  # inlined only as escapes
    proc = chromium(tmp_path, "--dump-dom", (tmp_path / "out" / "leaderboard.html").as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert re.search(r'<div id="js-errors" hidden="">\s*</div>', dom), "the page caught a JavaScript error"
    assert 'data-rendered="2"' in dom
    assert dom.count(html.escape(f"load{HOSTILE_NAME}.json")) >= 2  # in the table's headings, as text
    assert 'data-policy="Mine"' in dom
    assert str(policy) in json.loads((tmp_path / "out" / "leaderboard.json").read_text())["command"]
