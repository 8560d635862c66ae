"""Files the CLI reads and writes, through the console script: a file that is not UTF-8, JSON nested
too deeply, a damaged results folder given to ``engine explain`` or ``engine compare`` is one line
naming the file (exit 2, no traceback); an output that would overwrite an input or another output
is refused before the run; a multi-line error prints as one line. Publishing a results folder
over an old one, killed at any point, leaves one of them whole."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ENGINE = str(Path(sys.executable).parent / "engine")
ROOT = Path(__file__).resolve().parents[1]


def engine(*args, cwd=ROOT):
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=300, cwd=cwd)


def one_error_line(proc) -> str:
    """The one line on stderr of a command refused as bad input."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "unexpected" not in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A small results folder, written once, copied by each test that damages it."""
    out = tmp_path_factory.mktemp("results") / "good"
    proc = engine("run", "-n", "20", "-o", out, "-q")
    assert proc.returncode == 0, proc.stderr
    return out


# ------------------------------------------------------------------ files read as input

DEEP = "[" * 100_000 + "]" * 100_000


INPUTS = [  # (option, file name, content, what the line must say)
    (
        "-w",
        "latin1.json",
        b'{"kind": "synthetic", "tenants": {"caf\xe9": 1.0}}',
        "latin1.json:1: not UTF-8 text: byte 0xe9",
    ),
    ("-w", "deep.json", DEEP.encode(), "deep.json: not valid JSON: nested too deeply"),
    (
        "-w",
        "nan.json",
        b'{"kind": "synthetic", "num_requests": NaN}',
        "nan.json: not valid JSON: NaN is not a JSON number",
    ),
    ("--profile", "latin1-profile.json", b'{"name": "m\xfcde"}', "latin1-profile.json:1: not UTF-8 text: byte 0xfc"),
    ("--profile", "deep-profile.json", DEEP.encode(), "deep-profile.json: not valid JSON: nested too deeply"),
    (
        "--trace",
        "latin1.csv",
        b"arrival_time_s,prompt_tokens,output_tokens\n0,5,1\n1,5,\xff\n",
        "latin1.csv:3: not UTF-8 text: byte 0xff",
    ),
]


@pytest.fixture(scope="module")
def input_runs(tmp_path_factory) -> tuple[Path, dict]:
    """Every case of INPUTS, run concurrently (each is a second or two of starting Python)."""
    tmp = tmp_path_factory.mktemp("inputs")
    for _, name, content, _ in INPUTS:
        (tmp / name).write_bytes(content)
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(lambda case: engine("run", "-n", "5", "-q", case[0], tmp / case[1]), INPUTS))
    return tmp, dict(zip((case[1] for case in INPUTS), procs))


@pytest.mark.parametrize("option, name, content, expected", INPUTS, ids=[case[1] for case in INPUTS])
def test_an_unreadable_input_file_is_one_line_naming_it(input_runs, option, name, content, expected):
    tmp, procs = input_runs
    line = one_error_line(procs[name])
    assert f"{tmp / name}" in line and expected in line, line


def test_a_recorded_run_that_is_not_utf8_is_one_line_naming_its_line(tmp_path):
    (tmp_path / "steps.csv").write_bytes(
        b"prefill_tokens,decode_seqs,kv_tokens_read,blocks_swapped,blocks_copied,duration_s\n"
        b"1,2,3,0,0,0.01\n1,2,3,0,0,0.0\xb51\n"
    )
    line = one_error_line(engine("calibrate", tmp_path / "steps.csv", "-o", tmp_path / "p.json"))
    assert f"{tmp_path / 'steps.csv'}:3: not UTF-8 text: byte 0xb5 at column 14" in line, line


def _rewrite_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _rewrite_parquet(path: Path, change) -> None:
    import pandas as pd

    change(pd.read_parquet(path)).to_parquet(path, index=False)


def _set(frame, column, row, value):
    frame.loc[row, column] = value
    return frame


# (name, command, file, how it is damaged, what the line must say)
DAMAGE = [
    (
        "summary not JSON",
        "explain",
        "summary.json",
        lambda p: p.write_text("{broken"),
        "summary.json:1: not valid JSON",
    ),
    (
        "summary not UTF-8",
        "compare",
        "summary.json",
        lambda p: p.write_bytes(b'{"policy": "\xff"}'),
        "summary.json:1: not UTF-8 text",
    ),
    (
        "summary a list",
        "explain",
        "summary.json",
        lambda p: p.write_text("[1, 2]"),
        "summary.json: the file holds [1, 2], expected an object",
    ),
    (
        "summary a list (compare)",
        "compare",
        "summary.json",
        lambda p: p.write_text("[1, 2]"),
        "summary.json: the file holds [1, 2]",
    ),
    (
        "summary without config",
        "explain",
        "summary.json",
        lambda p: _rewrite_json(p, lambda d: d.pop("config")),
        "summary.json: no key 'config'",
    ),
    (
        "watermark a string",
        "explain",
        "summary.json",
        lambda p: _rewrite_json(p, lambda d: d["config"].update(watermark="1%")),
        "summary.json: key 'config.watermark' holds '1%', expected a finite number",
    ),
    (
        "ttft a string",
        "compare",
        "summary.json",
        lambda p: _rewrite_json(p, lambda d: d["ttft_s"].update(p99="slow")),
        "summary.json: key 'ttft_s.p99' holds 'slow', expected a finite number or null",
    ),
    (
        "a number no float holds",
        "compare",
        "summary.json",
        lambda p: _rewrite_json(p, lambda d: d.update(requests_per_s=10**400)),
        "summary.json: key 'requests_per_s' holds <int of 401 digits>, expected a finite number",
    ),
    (
        "requests.csv without ttft",
        "compare",
        "requests.csv",
        lambda p: p.write_text("request_id,tpot\nr1,0.1\n"),
        "requests.csv:1: no column 'ttft'",
    ),
    (
        "requests.csv with a word",
        "compare",
        "requests.csv",
        lambda p: p.write_text("request_id,ttft,tpot\nr0,0.5,0.1\nr1,abc,0.1\n"),
        "requests.csv:3: column 'ttft': not a finite number: 'abc'",
    ),
    (
        "requests.csv with inf",
        "compare",
        "requests.csv",
        lambda p: p.write_text("request_id,ttft,tpot\nr0,0.5,inf\n"),
        "requests.csv:2: column 'tpot': not a finite number: 'inf'",
    ),
    (
        "requests.csv cut short",
        "compare",
        "requests.csv",
        lambda p: p.write_text("request_id,ttft,tpot\nr0,0.5,0.1\nr1,0.5\n"),
        "requests.csv:3: expected 3 fields, got 2",
    ),
    (
        "requests.csv not UTF-8",
        "compare",
        "requests.csv",
        lambda p: p.write_bytes(b"request_id,ttft\nr\xe91,1\n"),
        "requests.csv:2: not UTF-8 text",
    ),
    (
        "requests.parquet garbage",
        "explain",
        "requests.parquet",
        lambda p: p.write_text("garbage"),
        "requests.parquet: not a readable Parquet file",
    ),
    (
        "requests.parquet without its columns",
        "explain",
        "requests.parquet",
        lambda p: _rewrite_parquet(p, lambda f: f[["request_id"]]),
        "requests.parquet: no column 'status'",
    ),
    (
        "ttft as text",
        "explain",
        "requests.parquet",
        lambda p: _rewrite_parquet(p, lambda f: f.assign(ttft=f.ttft.astype(str))),
        "requests.parquet: column 'ttft': holds",
    ),
    (
        "timeseries without its columns",
        "explain",
        "timeseries.parquet",
        lambda p: _rewrite_parquet(p, lambda f: f.drop(columns="time_s")),
        "timeseries.parquet: no column 'time_s'",
    ),
    (
        "decisions without steps",
        "explain",
        "decisions.parquet",
        lambda p: _rewrite_parquet(p, lambda f: f.drop(columns="step")),
        "decisions.parquet: no column 'step'",
    ),
    (
        "a step that is not in the run",
        "explain",
        "decisions.parquet",
        lambda p: _rewrite_parquet(p, lambda f: _set(f, "step", 0, 10**6)),
        "decisions.parquet: column 'step': step 1000000, but timeseries.parquet has steps 0-",
    ),
    (
        "a request that is not in the run",
        "explain",
        "decisions.parquet",
        lambda p: _rewrite_parquet(p, lambda f: _set(f, "request_id", f.request_id.first_valid_index(), "ghost")),
        "decisions.parquet: column 'request_id': request 'ghost'",
    ),
    (
        "time series cut short",
        "explain",
        "timeseries.parquet",
        lambda p: _rewrite_parquet(p, lambda f: f.iloc[:3]),
        "decisions.parquet: column 'step': step",
    ),
]


@pytest.fixture(scope="module")
def damaged_runs(good, tmp_path_factory) -> dict:
    """Every case of DAMAGE: a copy of the good folder, damaged, given to its command; run concurrently."""
    tmp = tmp_path_factory.mktemp("damaged")

    def run(case):
        name, command, file, damage, _ = case
        folder = tmp / name.replace(" ", "-")
        shutil.copytree(good, folder)
        damage(folder / file)
        return folder, engine("explain", folder) if command == "explain" else engine("compare", folder, good)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip((case[0] for case in DAMAGE), pool.map(run, DAMAGE)))


@pytest.mark.parametrize("name, command, file, damage, expected", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_results_folder_is_one_line_naming_the_file(damaged_runs, name, command, file, damage, expected):
    folder, proc = damaged_runs[name]
    line = one_error_line(proc)
    assert str(folder) in line and expected in line, line


# -------------------------------------------------------------------------- messages

MULTI_LINE = """
from pydantic import BaseModel

from kvsched import hookimpl
from kvsched.policies.vllm_default import VllmDefault


class Settings(BaseModel):
    x: int
    y: int


class ValidatesBadly(VllmDefault):
    name = "validates-badly"

    @hookimpl
    def on_step(self, report):
        Settings(x="a", y="b\\udcff\\x1b[31m")  # a multi-line ValidationError, with a lone surrogate and an escape
"""


def test_a_multi_line_policy_error_prints_as_one_printable_line(tmp_path):
    (tmp_path / "multi_line.py").write_text(MULTI_LINE)
    line = one_error_line(engine("run", "-n", "5", "-q", "-p", f"{tmp_path / 'multi_line.py'}:ValidatesBadly"))
    assert (
        "policy 'validates-badly' in on_step: raised ValidationError: 2 validation errors for Settings · x · " in line
    ), line
    assert "\x1b" not in line and len(line) < 1100


# --------------------------------------------------------------------------- outputs


def test_an_output_over_an_input_or_another_output_is_refused_before_the_run(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n0,5,2\n1,6,3\n")
    os.link(trace, tmp_path / "same-trace.csv")
    (tmp_path / "in-results").mkdir()
    shutil.copy(trace, tmp_path / "in-results" / "requests.csv")
    (tmp_path / "spec.json").write_text(json.dumps({"kind": "trace", "path": "trace.csv"}))
    os.symlink("/nonexistent/kvsched-out", tmp_path / "dangling")
    cases = [
        (
            ["-n", "5", "-o", "out", "--trace-out", "out/requests.csv"],
            "--trace-out out/requests.csv: is where --output out writes requests.csv",
        ),
        (
            ["--trace", "trace.csv", "-o", "out", "--trace-out", "trace.csv"],
            "--trace-out trace.csv: would overwrite --trace trace.csv",
        ),
        (
            ["--trace", "same-trace.csv", "-o", "out", "--trace-out", "trace.csv"],
            "--trace-out trace.csv: would overwrite --trace same-trace.csv",
        ),
        (["-w", "spec.json", "-o", "out", "--trace-out", "trace.csv"], f"would overwrite the workload's trace {trace}"),
        (
            ["--trace", "in-results/requests.csv", "-o", "in-results"],
            "--output in-results: its requests.csv would overwrite --trace",
        ),
        (
            ["-n", "5", "-o", "dangling"],
            "--output dangling: dangling is a symbolic link to /nonexistent/kvsched-out, which does not exist",
        ),
        (["-n", "5", "-o", "dangling/sub"], "dangling is a symbolic link to /nonexistent/kvsched-out"),
    ]
    for args, expected in cases:
        proc = engine("run", "-q", *args, cwd=tmp_path)
        line = one_error_line(proc)
        assert expected in line and "simulated" not in proc.stdout, (args, line)
    assert not (tmp_path / "out").exists() and trace.read_text().startswith("arrival_time_s")
    assert (tmp_path / "in-results" / "requests.csv").read_text() == trace.read_text()
    line = one_error_line(engine("calibrate", "steps.csv", "-o", "steps.csv", cwd=tmp_path))
    assert "--output steps.csv: would overwrite RECORDED steps.csv" in line
    shutil.copy(trace, tmp_path / "comparison.csv")
    line = one_error_line(
        engine("compare", "--policy", "fcfs", "--policy", "sjf", "--trace", "comparison.csv", "-o", ".", cwd=tmp_path)
    )
    assert "its comparison.csv would overwrite --trace comparison.csv" in line
    assert (tmp_path / "comparison.csv").read_text() == trace.read_text()
    spec = '{"kind": "synthetic", "num_requests": 5}'
    (tmp_path / "board").mkdir()
    (tmp_path / "board" / "leaderboard.json").write_text(spec)
    line = one_error_line(
        engine(
            "leaderboard",
            "-p",
            "fcfs",
            "-p",
            "sjf",
            "-w",
            "board/leaderboard.json",
            "--seeds",
            "1",
            "-o",
            "board",
            cwd=tmp_path,
        )
    )
    assert "its leaderboard.json would overwrite --workload board/leaderboard.json" in line
    assert (tmp_path / "board" / "leaderboard.json").read_text() == spec
    shutil.copy(trace, tmp_path / "in-results" / "requests.csv")
    line = one_error_line(
        engine("run", "--replicas", "2", "--trace", "in-results/requests.csv", "-o", "in-results", cwd=tmp_path)
    )
    assert "--output in-results: its requests.csv would overwrite --trace" in line
    assert (tmp_path / "in-results" / "requests.csv").read_text() == trace.read_text()


OLD = {"summary.json": "old", "requests.csv": "old", "report.html": "old"}
NEW = {"summary.json": "new", "requests.csv": "new"}


def _results(folder: Path) -> dict[str, str]:
    from kvsched.reporting.destination import RUN_FILES

    return {name: (folder / name).read_text() for name in RUN_FILES if (folder / name).exists()}


def _publish_and_stop_at(out: Path, k: int, how: str, inside: bool = False) -> int:
    """In a child process, publish NEW over ``out`` and stop at its ``k``-th file-system call: killed
    (``how="kill"``) or failing with ENOSPC (``"fail"``); the child's exit status (0: it got through).
    ``inside``: the child runs in ``out`` and publishes to ``.`` (``engine run -o .``)."""
    pid = os.fork()
    if pid:
        return os.waitpid(pid, 0)[1] >> 8
    try:  # the child: never returns to pytest
        if inside:
            os.chdir(out)
            out = Path(".")
        from kvsched.reporting import destination
        from kvsched.reporting.destination import OutputError, publishing_folder

        calls = [0]

        def stopping(fn):
            def call(*args, **kwargs):
                calls[0] += 1
                if calls[0] == k:
                    if how == "kill":
                        os._exit(9)
                    raise OSError(28, "No space left on device")
                return fn(*args, **kwargs)

            return call

        for name in ("rename", "replace", "unlink", "link", "rmdir", "chmod"):
            setattr(os, name, stopping(getattr(os, name)))
        if hasattr(destination, "_renameat2") and destination._renameat2() is not None:
            exchange = stopping(destination._renameat2())
            destination._renameat2 = lambda: exchange
        try:
            with publishing_folder(out) as stage:
                for name, text in NEW.items():
                    (stage / name).write_text(text)
        except OutputError:
            os._exit(3)
        os._exit(0)
    except BaseException:
        os._exit(4)


@pytest.mark.parametrize("how", ["kill", "fail"])
def test_publishing_over_old_results_stopped_anywhere_leaves_the_old_or_the_new_whole(tmp_path, how):
    for k in range(1, 60):
        out = tmp_path / f"out-{k}"
        (out / "sub").mkdir(parents=True)
        for name, text in OLD.items():
            (out / name).write_text(text)
        (out / "notes.txt").write_text("mine")
        (out / "sub" / "kept.txt").write_text("mine too")
        status = _publish_and_stop_at(out, k, how)
        assert status in (0, 3, 9), status
        assert _results(out) in (OLD, NEW), (k, how, _results(out))  # never a mix, never neither
        assert (out / "notes.txt").read_text() == "mine", k
        kept = [p for p in [out / "sub" / "kept.txt", *tmp_path.glob(f".out-{k}.*/sub/kept.txt")] if p.exists()]
        assert kept, (
            f"{k}: sub/kept.txt is gone"
        )  # in the new folder, or (killed just after the swap) in the old one beside it
        if status == 0:
            assert _results(out) == NEW and (out / "sub" / "kept.txt").exists()
            assert not list(tmp_path.glob(f".out-{k}.*")), "a staging folder was left behind"
            break
    else:
        pytest.fail("publishing never got through")


def test_the_folder_the_command_runs_in_is_replaced_in_place_not_swapped(tmp_path, monkeypatch):
    from kvsched.reporting.destination import publishing_folder

    out = tmp_path / "out"
    out.mkdir()
    for name, text in OLD.items():
        (out / name).write_text(text)
    inode = out.stat().st_ino
    monkeypatch.chdir(out)  # engine run -o . : a swap would leave the user's shell in a removed folder
    with publishing_folder(Path(".")) as stage:
        for name, text in NEW.items():
            (stage / name).write_text(text)
    assert os.getcwd() == str(out) and out.stat().st_ino == inode and _results(out) == NEW


def test_publishing_in_the_folder_the_command_runs_in_that_fails_anywhere_leaves_the_old_or_the_new_whole(tmp_path):
    """Replaced file by file (the folder is not swapped), a replace that failed half-way once left a mix of old
    and new results."""
    for k in range(1, 60):
        out = tmp_path / f"out-{k}"
        out.mkdir()
        for name, text in OLD.items():
            (out / name).write_text(text)
        (out / "notes.txt").write_text("mine")
        status = _publish_and_stop_at(out, k, "fail", inside=True)
        assert status in (0, 3), status
        assert _results(out) in (OLD, NEW), (k, _results(out))  # never a mix, never neither
        assert (out / "notes.txt").read_text() == "mine", k
        if status == 0:
            assert _results(out) == NEW
            break
    else:
        pytest.fail("publishing never got through")


def test_a_result_name_taken_by_a_folder_fails_publishing_in_place_and_keeps_the_old_results(tmp_path, monkeypatch):
    from kvsched.reporting.destination import OutputError, publishing_folder

    out = tmp_path / "out"
    (out / "trace.json").mkdir(parents=True)  # what a result's name holds, a folder, refuses its replace
    (out / "trace.json" / "mine.txt").write_text("mine")
    for name, text in OLD.items():
        (out / name).write_text(text)
    monkeypatch.chdir(out)
    with pytest.raises(OutputError), publishing_folder(Path(".")) as stage:
        for name, text in {**NEW, "trace.json": "{}"}.items():
            (stage / name).write_text(text)
    assert {name: (out / name).read_text() for name in OLD} == OLD
    assert (out / "trace.json" / "mine.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == sorted([*OLD, "trace.json"])  # nothing new, nothing left aside
