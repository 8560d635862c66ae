"""A fleet's files are read as every file a user gives is (``userfiles/reader.py``, ``reporting/reading.py``):
a ``--fleet`` spec that is not UTF-8, not JSON, nested too deeply or holds an integer too long to
convert is one error naming the file (a byte-order mark is dropped, as elsewhere); the spec is
never an output of its own run; and ``engine explain`` on a damaged fleet folder names the file,
line and column at fault, never a bare ``KeyError`` or pyarrow's message alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.cluster import FleetError, load_fleet
from kvsched.reporting.explain_fleet import explain_fleet
from kvsched.userfiles.reader import FileError

ENGINE = str(Path(sys.executable).parent / "engine")


def engine(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, (
        proc.stderr
    )
    return proc.stderr


# ------------------------------------------------------------------------------ --fleet
SPECS = {  # name: (the file's bytes, what the error says)
    "not UTF-8": (
        b'{"replicas": [{"count": 2}], "router": "\xff"}',
        "spec.json:1: not UTF-8 text: byte 0xff at column 41",
    ),
    "nested too deeply": (
        b'{"replicas": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "spec.json: not valid JSON: nested too deeply",
    ),
    "a 5,001-digit count": (
        b'{"replicas": [{"count": ' + b"9" * 5001 + b"}]}",
        "spec.json: not valid JSON: Exceeds the limit (4300 digits)",
    ),
    "not JSON": (b'{"replicas": [}', "spec.json:1: not valid JSON: Expecting value (column 15)"),
    "NaN": (b'{"replicas": [{"count": 2}], "staleness_s": NaN}', "spec.json: not valid JSON: NaN is not a JSON number"),
    "not an object": (b"[1, 2]", "spec.json: a fleet spec is a JSON object with a 'replicas' list"),
    "a count past the bound": (
        b'{"replicas": [{"count": 5000}]}',
        "spec.json: invalid fleet spec: replicas[0].count: Input should be less than or equal to 4096",
    ),
    "too many replicas in all": (
        b'{"replicas": [' + b", ".join([b'{"count": 4096}'] * 1000) + b"]}",
        "invalid fleet spec: a fleet has at most 4,096 replicas, all groups together; this one has 4,096,000",
    ),
    "too many replicas in two groups": (
        b'{"replicas": [{"count": 4096}, {"count": 1}]}',
        "invalid fleet spec: a fleet has at most 4,096 replicas, all groups together; this one has 4,097",
    ),
    "a transfer that never ends": (
        b'{"replicas": [{"role": "prefill"}, {"role": "decode"}], "transfer": {"bandwidth_gb_per_s": 1e-320}}',
        "invalid fleet spec: transfer.bandwidth_gb_per_s: Input should be greater than or equal to 0.000001",
    ),
    "a staleness past any run": (
        b'{"replicas": [{"count": 2}], "staleness_s": 1e308}',
        "invalid fleet spec: staleness_s: Input should be less than or equal to 3600",
    ),
    "a set-up that never ends": (
        b'{"replicas": [{"role": "prefill"}, {"role": "decode"}], "transfer": {"base_latency_s": 1e308}}',
        "invalid fleet spec: transfer.base_latency_s: Input should be less than or equal to 3600",
    ),
}


@pytest.mark.parametrize("case", list(SPECS))
def test_a_bad_fleet_spec_is_one_error_naming_the_file(tmp_path, case):
    content, message = SPECS[case]
    path = tmp_path / "spec.json"
    path.write_bytes(content)
    with pytest.raises((FileError, FleetError)) as caught:
        load_fleet(path)
    assert message in str(caught.value) and str(path) in str(caught.value) and "\n" not in str(caught.value), str(
        caught.value
    )


def test_a_fleet_spec_with_a_byte_order_mark_loads_as_any_file_does(tmp_path):
    path = tmp_path / "spec.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"replicas": [{"count": 3}], "staleness_s": 0.05}).encode())
    spec = load_fleet(path)
    assert spec.replicas[0].count == 3 and spec.staleness_s == 0.05


def test_the_console_script_refuses_a_bad_spec_in_one_line(tmp_path):
    path = tmp_path / "spec.json"
    path.write_bytes(SPECS["nested too deeply"][0])
    assert "not valid JSON: nested too deeply" in one_line_error(engine("run", "--fleet", path, "-n", "5", "-q"))


def test_the_spec_is_never_an_output_of_its_own_run(tmp_path):
    """Before: ``--fleet OUT/summary.json -o OUT`` ran, then wrote the fleet's summary over the spec."""
    out = tmp_path / "out"
    out.mkdir()
    spec = out / "summary.json"
    spec.write_text('{"replicas": [{"count": 2}]}')
    error = one_line_error(engine("run", "--fleet", spec, "-o", out, "-n", "5", "-q"))
    assert f"--output {out}: its summary.json would overwrite --fleet {spec}, which the command reads" in error
    assert spec.read_text() == '{"replicas": [{"count": 2}]}' and sorted(p.name for p in out.iterdir()) == [
        "summary.json"
    ]


def test_a_file_the_spec_names_is_never_an_output_either(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    profile = out / "summary.json"  # a cost profile by an unlucky name, where the run writes its summary
    profile.write_text("{}")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"replicas": [{"count": 2, "profile": str(profile)}]}))
    error = one_line_error(engine("run", "--fleet", spec, "-o", out, "-n", "5", "-q"))
    assert (
        f"its summary.json would overwrite the profile of replica group 0 {profile}, which the command reads" in error
    )
    assert profile.read_text() == "{}"


# ------------------------------------------------------------------ engine explain on a fleet
@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fleet") / "run"
    proc = engine("run", "--replicas", "2", "-n", "8", "-q", "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


def damaged(fleet_dir: Path, tmp_path: Path, name: str, content: bytes | None) -> Path:
    copy = tmp_path / "damaged"
    shutil.copytree(fleet_dir, copy)
    if content is None:
        (copy / name).unlink()
    else:
        (copy / name).write_bytes(content)
    return copy


HEADER = b"request_id,pool,time,replica,reason\n"
# name: (the file, its new content (None: removed), the request asked about (None: the overview), what the error says)
DAMAGE = {
    "routes.csv empty": ("routes.csv", b"", None, "routes.csv: not a readable CSV file (Empty CSV file)"),
    "routes.csv without a column": (
        "routes.csv",
        b"request_id,pool\nreq-1,mixed\n",
        None,
        "routes.csv:1: no column 'time'",
    ),
    "routes.csv not UTF-8": (
        "routes.csv",
        HEADER + b"\xff,mixed,0,replica-0,x\n",
        None,
        "routes.csv:2: not UTF-8 text: byte 0xff",
    ),
    "routes.csv a time not a number": (
        "routes.csv",
        HEADER + b"req-1,mixed,soon,replica-0,x\n",
        None,
        "routes.csv:2: column 'time': 'soon' is not a number",
    ),
    "routes.csv an empty time": (
        "routes.csv",
        HEADER + b"req-1,mixed,,replica-0,x\n",
        "req-1",
        "routes.csv:2: column 'time': an empty cell, where engine run writes a value",
    ),
    "routes.csv a short line": (
        "routes.csv",
        HEADER + b"req-1,mixed,0.1,replica-0,x\nreq-2,mixed\n",
        None,
        "routes.csv:3: expected 5 fields, got 2",
    ),
    "requests.csv empty": ("requests.csv", b"", "req-1", "requests.csv: not a readable CSV file (Empty CSV file)"),
    "summary.json replicas a number": (
        "summary.json",
        b'{"replicas": 5}',
        "req-1",
        "summary.json: key 'replicas' holds 5, expected a list",
    ),
    "summary.json a replica without a name": (
        "summary.json",
        b'{"replicas": [{"replica": 1}]}',
        "req-1",
        "summary.json: key 'replicas[0].replica' holds 1, expected a string",
    ),
    "summary.json missing": (
        "summary.json",
        None,
        "req-1",
        "summary.json: cannot read summary: No such file or directory",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_explaining_a_damaged_fleet_folder_names_the_file_line_and_column(fleet_dir, tmp_path, case):
    """Before: ``error: replica``, ``error: Empty CSV file``, ``unexpected TypeError``."""
    name, content, request, message = DAMAGE[case]
    folder = damaged(fleet_dir, tmp_path, name, content)
    with pytest.raises(FileError) as caught:
        explain_fleet(folder, request)
    assert message in str(caught.value) and str(folder / name) in str(caught.value), str(caught.value)


def test_the_console_script_explains_a_damaged_fleet_in_one_line(fleet_dir, tmp_path):
    folder = damaged(fleet_dir, tmp_path, "summary.json", b'{"replicas": 5}')
    assert "summary.json: key 'replicas' holds 5, expected a list" in one_line_error(
        engine("explain", folder, "--request", "req-1")
    )
    said = one_line_error(engine("explain", fleet_dir, "--step", "3"))
    assert "--step does not apply to a fleet's folder: it has no steps to explain" in said


def test_an_intact_fleet_folder_is_explained(fleet_dir):
    overview = explain_fleet(fleet_dir, None)
    assert overview[0] == "8 routing decisions over 2 replicas" and "commonest reasons:" in overview
    one = explain_fleet(fleet_dir, "req-1")
    assert "mixed pool → replica-1" in one[0] and one[1].startswith("ended FINISHED_") and " on replica-1:" in one[1]
    with pytest.raises(KeyError, match="request 'nope' is not in"):
        explain_fleet(fleet_dir, "nope")
