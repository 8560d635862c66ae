"""The Perfetto / Chrome trace, checked against the JSON trace event format as documented
("Trace Event Format", the Catapult document that ui.perfetto.dev and chrome://tracing read):
an object with a ``traceEvents`` array; complete events (``X``) with a name, a category, ``ts``
and ``dur`` in microseconds, a pid, a tid and args; counters (``C``) whose args are numbers;
metadata (``M``) naming processes and threads. Perfetto's JSON importer also needs the slices of
one thread to nest, so those of one track here must not overlap. The ``perfetto`` package's own
trace processor downloads a binary on first use, which a machine without internet cannot.
"""

import gzip
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

ENGINE = str(Path(sys.executable).parent / "engine")
PHASES = {"queued", "prefill", "decode", "preempted", "swapped"}
METADATA = {
    "process_name": "name",
    "thread_name": "name",
    "process_sort_index": "sort_index",
    "thread_sort_index": "sort_index",
}


def engine(*args):
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=300)


def number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_event(e: dict) -> None:
    """One event against the format's schema for its phase."""
    assert isinstance(e.get("name"), str) and e["name"], e
    assert isinstance(e.get("pid"), int), e
    ph = e.get("ph")
    if ph == "X":
        assert isinstance(e.get("cat"), str) and isinstance(e.get("tid"), int), e
        assert number(e.get("ts")) and e["ts"] >= 0 and number(e.get("dur")) and e["dur"] >= 0, e
        assert isinstance(e.get("args", {}), dict), e
    elif ph == "C":
        assert number(e.get("ts")) and e["ts"] >= 0, e
        assert e["args"] and all(isinstance(k, str) and number(v) for k, v in e["args"].items()), e
    elif ph == "M":
        key = METADATA[e["name"]]
        assert isinstance(e.get("tid"), int) and set(e["args"]) == {key}, e
        assert isinstance(e["args"][key], str if key == "name" else int), e
    else:
        raise AssertionError(f"unexpected phase {ph!r} in {e}")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """A run under KV pressure with forced swapping, so that every phase kind occurs."""
    tmp = tmp_path_factory.mktemp("trace")
    proc = engine(
        "run",
        "-q",
        "-n",
        "120",
        "--set",
        "num_gpu_blocks=300",
        "--set",
        "preemption_mode=swap",
        "--output",
        tmp / "out",
        "--trace-out",
        tmp / "trace.json.gz",
    )
    assert proc.returncode == 0, proc.stderr
    with gzip.open(tmp / "trace.json.gz", "rt") as f:
        return json.load(f), tmp / "out"


def test_every_event_follows_the_format(traced):
    doc, _ = traced
    assert doc["displayTimeUnit"] in ("ms", "ns") and isinstance(doc["otherData"], dict)
    for e in doc["traceEvents"]:
        check_event(e)
    slices = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            slices[e["pid"], e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for track, spans in slices.items():  # one track's slices in time order never overlap (they need not nest)
        spans.sort()
        assert all(a_end <= b_start + 0.2 for (_, a_end), (b_start, _) in zip(spans, spans[1:])), track


def test_steps_are_slices_with_their_batch_and_queues_are_counters(traced):
    doc, out = traced
    steps = pd.read_parquet(out / "timeseries.parquet")
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert [e["args"]["step"] for e in slices] == steps.step.tolist()
    assert {e["name"] for e in slices} <= {"prefill", "decode", "mixed", "idle"}
    assert [e["args"].get("decode_seqs", 0) for e in slices] == steps.decode_seqs.tolist()
    assert [e["args"].get("prefill_tokens", 0) for e in slices] == steps.prefill_tokens.tolist()
    admitted = sum(len(e["args"].get("admitted", ())) for e in slices)
    log = pd.read_parquet(out / "decisions.parquet")
    assert admitted == (log.event == "admitted").sum()
    queues = [e for e in events if e["ph"] == "C" and e["name"] == "queues"]
    last = queues[-1]["args"]
    assert (last["waiting"], last["running"], last["swapped"]) == (0, 0, 0)
    assert max(e["args"]["swapped"] for e in queues) == steps.num_swapped.max() > 0
    assert any(e["ph"] == "C" and e["name"] == "KV blocks used" for e in events)


def test_one_track_per_request_covers_its_life(traced):
    doc, out = traced
    requests = pd.read_parquet(out / "requests.parquet").set_index("request_id")
    events = doc["traceEvents"]
    names = {
        e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 2
    }
    assert sorted(names.values()) == sorted(requests.index)
    spans = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["cat"] == "request":
            spans[names[e["tid"]]].append(e)
    kinds = {e["name"] for track in spans.values() for e in track}
    assert kinds <= PHASES and {"queued", "prefill", "decode", "swapped"} <= kinds
    for rid, track in spans.items():
        r = requests.loc[rid]
        assert track[0]["ts"] == pytest.approx(r.arrival_time * 1e6, abs=0.2)
        assert track[-1]["ts"] + track[-1]["dur"] == pytest.approx(r.finish_time * 1e6, abs=0.2 * len(track))
        for a, b in zip(track, track[1:]):  # phases follow each other without a gap
            assert a["ts"] + a["dur"] == pytest.approx(b["ts"], abs=0.2)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--trace-out", "t.json"), "--trace-out needs --output"),
        (("--plot", "--output", "o", "--no-decision-log"), "drop --no-decision-log"),
    ],
)
def test_trace_and_report_need_the_log(tmp_path, args, message):
    proc = subprocess.run(
        [ENGINE, "run", "-q", "-n", "5", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
