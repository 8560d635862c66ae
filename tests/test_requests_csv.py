"""One ``requests.csv`` writer for a single run and a fleet (``reporting/files.py``'s ``write_requests``): the same
row order (the order the requests arrived), the same numbers, the same quoting; a fleet's file is a single run's
columns, then the fleet's own (``cluster/records.py``'s ``EXTRA``)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsched.cluster.records import EXTRA
from kvsched.metrics.records import SCHEMA, Recorder, records_table
from kvsched.metrics.requests import FIELDS, RequestMetrics
from kvsched.reporting.explain_fleet import FLEET_REQUESTS
from kvsched.reporting.files import write_requests
from kvsched.reporting.reading import read_csv

ENGINE = str(Path(sys.executable).parent / "engine")
RUN = ["run", "-q", "-n", "40", "--rate", "20", "--seed", "3", "--policy", "vllm-v1"]


def engine_run(out: Path, *fleet: str) -> list[str]:
    """The lines of ``requests.csv`` of ``engine run`` (as a fleet, given ``fleet``'s options) into ``out``."""
    proc = subprocess.run([ENGINE, *RUN, *fleet, "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return (out / "requests.csv").read_bytes().decode().splitlines()


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> list[str]:
    return engine_run(tmp_path_factory.mktemp("single") / "run")


def test_a_fleet_of_one_writes_a_single_runs_requests_csv_then_its_own_columns(single, tmp_path):
    """Before: the fleet's file came from pyarrow (every text quoted, ``0`` for ``0.0``), in the order requests
    finished; a single run's from Python's csv module, in the order they arrived."""
    fleet = engine_run(tmp_path / "fleet", "--replicas", "1")
    assert fleet[0] == ",".join(FIELDS + tuple(EXTRA.names)) and single[0] == ",".join(FIELDS)
    assert len(fleet) == len(single) == 41
    for one, of_fleet in zip(single[1:], fleet[1:]):
        assert of_fleet.startswith(one + ","), (one, of_fleet)  # the same bytes, then replica, prompt_replica, cached
        assert of_fleet[len(one) + 1 :].startswith("0,0,")


@pytest.mark.parametrize(
    "fleet",
    [["--replicas", "3", "--router", "round-robin"], ["--prefill-replicas", "1", "--decode-replicas", "2"]],
    ids=["three replicas", "P/D"],
)
def test_a_fleets_rows_are_in_the_order_the_requests_arrived(tmp_path, fleet):
    """Before: a fleet's rows came in the order its requests finished, across replicas. (The synthetic workload's
    requests sample one sequence each, as P/D needs.)"""
    single = engine_run(tmp_path / "single", "--workload", "synthetic")
    lines = engine_run(tmp_path / "fleet", "--workload", "synthetic", *fleet)
    ids = [row[0] for row in csv.reader(lines[1:])]
    assert ids == [row[0] for row in csv.reader(single[1:])] and len(ids) == 40


TEXT = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)  # commas, quotes, any script
TIME = st.none() | st.floats(allow_nan=False, allow_infinity=False, width=64)
RECORD = st.builds(
    RequestMetrics,
    request_id=TEXT,
    status=st.sampled_from(["FINISHED_STOPPED", "FINISHED_IGNORED", "FINISHED_ABORTED"]),
    finish_reason=st.none() | TEXT,
    detail=st.none() | TEXT,
    priority=st.integers(-(2**63), 2**63 - 1),
    tenant=TEXT,
    n=st.integers(1, 8),
    prompt_tokens=st.integers(0, 10**9),
    output_tokens=st.integers(0, 10**9),
    arrival_time=st.floats(0, 1e9),
    first_scheduled_time=TIME,
    first_token_time=TIME,
    finish_time=TIME,
    queueing_time=TIME,
    ttft=TIME,
    tpot=TIME,
    e2e=TIME,
    preemptions_recompute=st.integers(0, 100),
    preemptions_swap=st.integers(0, 100),
    slo_class=st.none() | TEXT,
    session_id=st.none() | TEXT,
)


@given(st.lists(RECORD, min_size=1, max_size=8), st.data())
def test_a_fleets_cells_are_a_runs_cells_and_read_back_as_written(tmp_path_factory, records, data):
    """Whatever the records hold, a fleet's file has a run's cells, text for text, then its own; every value reads
    back (pyarrow, as ``engine explain`` reads a fleet's file) as it was."""
    folder = tmp_path_factory.mktemp("csv")
    table = records_table(records)
    for field in EXTRA:
        column = data.draw(st.lists(st.integers(0, 9), min_size=len(records), max_size=len(records)))
        table = table.append_column(field, pa.array(column, field.type))
    run, fleet = write_requests(records, folder / "run.csv"), write_requests(table, folder / "fleet.csv")
    with run.open(newline="", encoding="utf-8") as a, fleet.open(newline="", encoding="utf-8") as b:
        for of_run, of_fleet in zip(csv.reader(a), csv.reader(b), strict=True):
            assert of_fleet[: len(FIELDS)] == of_run and len(of_fleet) == len(FIELDS) + len(EXTRA)
    back = read_csv(fleet, pa.schema([*SCHEMA, *EXTRA]))
    for name in ("priority", "prompt_tokens", "arrival_time", "ttft", "e2e", *EXTRA.names):
        assert back[name].to_pylist() == table[name].to_pylist(), name
    assert read_csv(fleet, FLEET_REQUESTS).num_rows == len(records)


def test_a_table_that_does_not_start_with_a_runs_columns_is_refused(tmp_path):
    table = pa.table({"replica": [0], "request_id": ["a"]})
    with pytest.raises(ValueError, match="starts with the columns"):
        write_requests(table, tmp_path / "requests.csv")
    assert not (tmp_path / "requests.csv").exists()


@given(st.permutations(range(12)), st.integers(1, 5))
def test_the_recorder_keeps_records_in_the_order_of_arrival_in_memory_or_in_its_file(tmp_path_factory, finished, group):
    """Whatever order the requests finish in, a run's file and a fleet's rows are in the order they arrived."""
    path = tmp_path_factory.mktemp("recorder") / "requests.parquet"
    schema = pa.schema([("request_id", pa.string()), ("place", pa.int64())])
    kept, streamed = Recorder(schema), Recorder(schema, path, row_group_size=group)
    for place in finished:
        kept.add(place, (f"r{place}", place))
        streamed.add(place, (f"r{place}", place))
    assert kept.close().column("place").to_pylist() == list(range(12))
    assert pq.read_table(streamed.close().path).column("place").to_pylist() == list(range(12))


def test_the_recorder_refuses_a_request_recorded_twice():
    recorder = Recorder(pa.schema([("request_id", pa.string())]))
    recorder.add(1, ("b",))
    with pytest.raises(ValueError, match="request 'b' is recorded twice"):
        recorder.add(1, ("b",))
    recorder.add(0, ("a",))
    with pytest.raises(ValueError, match="request 'a' is recorded twice"):
        recorder.add(0, ("a",))
    assert recorder.rows == [("a",), ("b",)]
