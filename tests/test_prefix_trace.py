"""Traces with prefix structure (workloads/prefix_trace.py): Mooncake's JSON lines of timestamp (ms),
input_length, output_length and hash_ids, read one line at a time, validated, and made into prompts
whose shared blocks are exactly the trace's shared hash ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched import Engine, EngineConfig, SimulatedExecutor
from kvsched.workloads import WorkloadError, build_workload, load_spec
from kvsched.workloads.prefix_trace import PrefixTraceWorkload

ENGINE = str(Path(sys.executable).with_name("engine"))


def write(path: Path, *rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def line(t, n, out, ids, **kw) -> dict:
    return {"timestamp": t, "input_length": n, "output_length": out, "hash_ids": ids, **kw}


def test_equal_hash_ids_are_equal_blocks_and_nothing_else_is(tmp_path):
    f = write(tmp_path / "t.jsonl", line(0, 10, 2, [7, 8, 9]), line(1500, 9, 3, [7, 8, 4]), line(3000, 4, 1, [8]))
    a, b, c = PrefixTraceWorkload(path=f, hash_block_size=4).requests()
    assert (a.prompt_len, b.prompt_len, c.prompt_len) == (10, 9, 4)
    assert a.prompt_token_ids[:8] == b.prompt_token_ids[:8] and a.prompt_token_ids[8] != b.prompt_token_ids[8]
    assert c.prompt_token_ids == a.prompt_token_ids[4:8]  # the same block, though not a shared prefix
    assert (a.arrival_time, b.arrival_time, c.arrival_time) == (0.0, 1.5, 3.0)  # ms to s, from the first line
    assert (b.output_len, b.sampling.max_tokens) == (3, 3)


def test_the_prefix_cache_sees_exactly_the_shared_leading_blocks(tmp_path):
    f = write(
        tmp_path / "t.jsonl", line(0, 12, 1, [1, 2, 3]), line(10_000, 12, 1, [1, 2, 5]), line(20_000, 12, 1, [9, 2, 3])
    )
    eng = Engine(
        EngineConfig(
            block_size=4, num_gpu_blocks=64, enable_prefix_caching=True, max_num_batched_tokens=64, max_num_seqs=8
        ),
        "vllm-v1",
        SimulatedExecutor(),
    )
    cached = {}
    eng.run(
        PrefixTraceWorkload(path=f, hash_block_size=4).requests(),
        on_step=lambda r: cached.update(
            {s.group.request_id: s.num_cached_tokens for s in r.output.scheduled if s.is_prefill}
        ),
    )
    assert cached == {"req-0": 0, "req-1": 8, "req-2": 0}  # block 2 after a different first block is not a prefix


def test_mooncake_blocks_are_512_tokens_by_default(tmp_path):
    f = write(tmp_path / "t.jsonl", line(0, 513, 1, [0, 1]))
    (r,) = build_workload(trace=f).requests()
    assert r.prompt_len == 513 and r.prompt_token_ids[510:] == (510, 511, 512)


def test_a_session_id_is_carried_and_max_requests_and_rate_scale_apply(tmp_path):
    f = write(
        tmp_path / "t.jsonl",
        line(0, 4, 1, [1], session_id="s1"),
        line(2000, 4, 1, [1], session_id=7),
        line(4000, 4, 1, [2]),
    )
    rs = build_workload(trace=f, num_requests=2, rate_scale=2.0).requests()
    assert [(r.session_id, r.arrival_time) for r in rs] == [("s1", 0.0), ("7", 1.0)]


@pytest.mark.parametrize(
    ("row", "where", "message"),
    [
        ('{"timestamp": 0, "input_length": 4', ":2", "not a JSON object"),
        ("[1, 2]", ":2", "expected a JSON object"),
        ('{"timestamp": 0}', ":2", "missing key(s) input_length, output_length, hash_ids"),
        (line(-1, 4, 1, [1]), ":2: column 'timestamp'", "finite time"),
        (line(float("inf"), 4, 1, [1]), ":2: column 'timestamp'", "finite time"),  # json writes Infinity
        (line(500, 4, 1, [1]), ":2: column 'timestamp'", "precedes the previous line's 1000"),
        (line(2000, 0, 1, []), ":2: column 'input_length'", "integer from 1 to 1,048,576"),
        (line(2000, 4, 2.5, [1]), ":2: column 'output_length'", "integer from 1 to 2,147,483,648"),
        (line(2000, 600, 1, [1]), ":2: column 'hash_ids'", "1 hash ids for 600 tokens: expected 2"),
        (line(2000, 4, 1, ["a"]), ":2: column 'hash_ids'", "list of integers"),
        (line(2000, 4, 1, [1], session_id=""), ":2: column 'session_id'", "non-empty"),
        ("", ":2", "empty line"),
    ],
)
def test_every_bad_line_is_named_with_its_file_line_and_key(tmp_path, row, where, message):
    f = write(tmp_path / "bad.jsonl", line(1000, 4, 1, [1]), row)
    with pytest.raises(WorkloadError) as err:
        build_workload(trace=f).requests()
    assert f"{f}{where}" in str(err.value) and message in str(err.value)


def test_it_is_streamed_a_bad_line_is_met_when_it_is_reached(tmp_path):
    f = write(tmp_path / "t.jsonl", line(0, 4, 1, [1]), "not json")
    requests = PrefixTraceWorkload(path=f, cap={"kind": "fixed", "tokens": 8}).iter_requests()
    assert next(requests).request_id == "req-0"
    with pytest.raises(WorkloadError, match=":2"):
        next(requests)
    with pytest.raises(WorkloadError, match=":2"):  # the default cap, the file's longest answer, reads it whole first
        next(PrefixTraceWorkload(path=f).iter_requests())


def test_an_empty_file_and_options_that_do_not_apply_are_refused(tmp_path):
    with pytest.raises(WorkloadError, match="no requests"):
        build_workload(trace=write(tmp_path / "e.jsonl")).requests()
    f = write(tmp_path / "t.jsonl", line(0, 4, 1, [1]))
    with pytest.raises(WorkloadError, match="replays its own timestamps"):
        build_workload(trace=f, rate=3.0)


def test_a_spec_file_sets_the_block_size_of_the_ids(tmp_path):
    write(tmp_path / "t.jsonl", line(0, 8, 1, [3, 4]))
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps({"kind": "prefix-trace", "path": "t.jsonl", "hash_block_size": 4}))
    (r,) = load_spec(spec).requests()
    assert r.prompt_token_ids == (12, 13, 14, 15, 16, 17, 18, 19)
    spec.write_text(json.dumps({"kind": "prefix-trace", "path": "t.jsonl", "hash_block_size": 0}))
    with pytest.raises(WorkloadError, match="hash_block_size"):
        load_spec(spec)


def test_engine_run_replays_a_jsonl_trace(tmp_path):
    f = write(tmp_path / "t.jsonl", *[line(i * 200, 1000, 4, [i % 2, 10 + i]) for i in range(6)])
    proc = subprocess.run(
        [
            ENGINE,
            "run",
            "--trace",
            str(f),
            "--policy",
            "vllm-v1",
            "--set",
            "enable_prefix_caching=true",
            "-q",
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["finished"] == 6 and summary["recompute"]["computed_tokens"] > 0
