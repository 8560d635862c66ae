"""The built-in long-context sessions (workloads/long_context.py): the shape of the trace it stands for
(Mooncake's conversation trace: about 12,000 requests in an hour, a mean prompt of about 12,000 tokens,
at most 37 % of prompt tokens reusable by an infinite cache, a session's next turn about two minutes
after the last), prompts as hash ids the trace replay reads alike, and the name and spec end to end."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.workloads import WORKLOAD_NAMES, WorkloadError, build_workload, load_spec
from kvsched.workloads.caps import FixedCap
from kvsched.workloads.long_context import LongContextSpec
from kvsched.workloads.prefix_trace import PrefixTraceWorkload, reusable_share

ENGINE = str(Path(sys.executable).parent / "engine")


@pytest.fixture(scope="module")
def rows():
    return list(LongContextSpec().rows())


def test_the_built_in_has_the_traces_shape(rows):
    first_hour = [r for r in rows if r[0] - rows[0][0] <= 3_600_000]
    prompts = sorted(r[1] for r in rows)
    assert 11_500 <= len(first_hour) <= 12_500  # 12,031 in the trace's hour
    assert 11_000 <= statistics.mean(prompts) <= 13_000  # about 12,000
    assert prompts[len(prompts) // 10] < 4_000 and prompts[9 * len(prompts) // 10] > 20_000 and prompts[-1] <= 131_072
    assert 0.30 <= reusable_share(rows, 512) <= 0.37  # at most 37 % with an infinite cache
    assert 300 <= statistics.mean(r[2] for r in rows) <= 400  # Mooncake's conversation trace: 343 output tokens
    last, gaps = {}, []
    for t, *_, session in rows:
        if session in last:
            gaps.append((t - last[session]) / 1000)
        last[session] = t
    assert 108 <= statistics.mean(gaps) <= 132  # about two minutes between a session's turns
    assert all(len(ids) == -(-length // 512) for _, length, _, ids, _ in rows)
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)


def test_a_turn_extends_its_sessions_last_prompt_and_sessions_share_only_the_system_prompt():
    spec = LongContextSpec(num_sessions=40, system_prompts=2, system_blocks=2, seed=3)
    by_session: dict[str, list] = {}
    for _, length, output, ids, session in spec.rows():
        by_session.setdefault(session, []).append((length, output, ids))
    systems = set()
    for turns in by_session.values():
        systems.add(tuple(turns[0][2][:2]))
        for (length, output, ids), (longer, _, later) in zip(turns, turns[1:]):
            full = length // 512
            assert later[:full] == ids[:full] and longer > length + output  # its full blocks, then new ones
            assert full == len(ids) or later[full] != ids[full]  # a partial block filled in is a new block
    assert systems <= {(0, 1), (2, 3)}
    owned = [set(ids[2:]) for turns in by_session.values() for ids in [turns[-1][2]]]
    assert all(not (a & b) for i, a in enumerate(owned) for b in owned[i + 1 :])


def test_written_as_a_trace_it_replays_as_the_same_requests(tmp_path):
    spec = LongContextSpec(num_sessions=25, rate=0.5, seed=7)
    path = tmp_path / "long.jsonl"
    spec.write_trace(path)
    replay = PrefixTraceWorkload(path=path, cap=FixedCap(tokens=spec.output.upper))
    built, replayed = spec.requests(), replay.requests()
    assert len(built) == spec.num_requests > 25
    assert [r.model_dump() for r in built] == [r.model_dump() for r in replayed]


def test_the_name_and_a_spec_build_it_and_bad_input_is_named(tmp_path):
    assert "long-context" in WORKLOAD_NAMES
    built = build_workload("long-context", num_requests=5, seed=2, rate_scale=2.0)
    assert built == LongContextSpec(num_sessions=5, seed=2, rate=LongContextSpec().rate * 2)
    spec = tmp_path / "lc.json"
    spec.write_text(json.dumps({"kind": "long-context", "num_sessions": 3, "think_time_s": 30}))
    assert load_spec(spec).think_time_s == 30 and load_spec(spec, num_requests=2).num_sessions == 2
    spec.write_text(json.dumps({"kind": "long-context", "block_size": 0}))
    with pytest.raises(WorkloadError, match="block_size"):
        load_spec(spec)
    with pytest.raises(WorkloadError, match="starts sessions at its own rate"):
        build_workload("long-context", rate=3.0)


def test_engine_runs_it_on_a_fleet():
    command = [
        ENGINE,
        "run",
        "-w",
        "long-context",
        "-n",
        "6",
        "--replicas",
        "2",
        "--router",
        "precise-prefix",
        "--policy",
        "vllm-v1",
        "--set",
        "enable_prefix_caching=true",
        "--set",
        "max_model_len=131072",
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "router precise-prefix" in out.stdout and "14 / 0 / 0" in out.stdout  # 6 sessions, 14 turns, all finished
