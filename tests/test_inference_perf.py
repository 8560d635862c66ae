"""inference-perf configs as workloads, checked against inference-perf 0.7's documented and coded
semantics (the package needs Python 3.12 and transformers 5.13, so it cannot run beside kvsched here:
these tests restate what its source does, read from the 0.7.0 wheel, and check kvsched does it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.executors.cost_model import CostProfile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.workloads import build_workload
from kvsched.workloads.errors import WorkloadError
from kvsched.workloads.inference_perf import STAGE_START_S, load_inference_perf
from kvsched.workloads.inference_perf_draws import Distribution, constant_times, generate, poisson_times, sample

ENGINE = str(Path(sys.executable).with_name("engine"))
UNIT = CostProfile(
    name="unit",
    base_ms=10.0,
    prefill_token_ms=0.01,
    decode_seq_ms=0.1,
    kv_token_ms=0.0,
    kv_bytes_per_token=0,
    swap_gb_per_s=1.0,
    copy_gb_per_s=1.0,
)


def config_file(tmp_path, data: dict, name: str = "ip.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def shared(**sp) -> dict:
    prefix = {
        "num_groups": 3,
        "num_prompts_per_group": 4,
        "system_prompt_len": 20,
        "question_len": 30,
        "output_len": 5,
        **sp,
    }
    return {
        "data": {"type": "shared_prefix", "shared_prefix": prefix},
        "load": {"type": "constant", "stages": [{"rate": 10, "duration": 2}, {"rate": 5, "duration": 2}]},
    }


def test_fixed_lengths_and_the_samplers_are_inference_perfs():
    rng = np.random.default_rng(3)
    assert list(sample(Distribution.fixed(7), 3, rng)) == [7, 7, 7]
    d = Distribution(min=10, max=20, mean=15, std_dev=5)
    expected = np.clip(np.round(np.clip(np.random.default_rng(1).normal(15, 5, 100), 10, 20)), 10, 20)
    assert list(sample(d, 100, np.random.default_rng(1))) == list(expected.astype(int))
    u = Distribution(min=10, max=12, type="uniform")
    assert set(sample(u, 2000, rng)) == {10, 11, 12}  # [min, max + 1), rounded and clipped: max is drawn
    assert set(generate(u, 2000, rng)) == {10, 11, 12}  # the older sampler: [min, max), rounded: max only by rounding
    with pytest.raises(ValueError, match="Mean cannot be outside"):
        generate(Distribution(min=10, max=20, mean=30), 5, rng)
    with pytest.raises(ValueError, match="either 'std_dev' or 'variance'"):
        Distribution(variance=4.0)  # std_dev's default 200 stands: inference-perf refuses both
    assert Distribution(variance=4.0, std_dev=0).std_dev == 2.0


def test_constant_load_is_exponential_gaps_scaled_to_the_stage():
    times = constant_times(7.5, 40, np.random.default_rng(0), start=3.0)
    assert len(times) == int(7.5 * 40)
    assert times[-1] == pytest.approx(43.0) and np.all(np.diff(times) > 0) and times[0] > 3.0
    gaps = np.diff(np.concatenate(([3.0], times)))
    assert 0.7 < np.std(gaps) / np.mean(gaps) < 1.3  # exponential: cv about 1, not a metronome


def test_poisson_load_spreads_each_seconds_count_over_that_second():
    times = poisson_times(3.0, 500, np.random.default_rng(2))
    assert len(times) == 500 and np.all(np.diff(times) >= 0)
    seconds = np.floor(times - 1e-9)
    counts = np.bincount(seconds.astype(int))
    assert 2.5 < counts.mean() < 3.5 and counts.var() > 1.5  # a Poisson(3) count per second (variance about 3)


def test_shared_prefix_prompts_share_their_groups_system_prompt_and_recur(tmp_path):
    w = load_inference_perf(config_file(tmp_path, shared()), seed=4)
    assert w.num_requests == 20 + 10 and len(w.prompts) == 12
    heads = {}
    for p in w.prompts:
        heads.setdefault(p[:20], []).append(p)
    assert len(heads) == 3 and all(len(v) == 4 for v in heads.values())  # 3 system prompts, 4 questions each
    assert all(len(p) == 50 for p in w.prompts) and len({p[20:] for p in w.prompts}) == 12
    requests = w.requests()
    assert requests[0].prompt_token_ids == requests[12].prompt_token_ids  # request i sends prompt i mod N
    assert requests[20].prompt_token_ids == requests[0].prompt_token_ids  # the next stage starts again at prompt 0
    assert all(r.output_len == 5 and r.sampling.max_tokens == 5 and r.sampling.ignore_eos for r in requests)


def test_older_field_names_are_read(tmp_path):
    data = shared()
    sp = data["data"]["shared_prefix"]
    sp["num_unique_system_prompts"] = sp.pop("num_groups")
    sp["num_users_per_system_prompt"] = sp.pop("num_prompts_per_group")
    w = load_inference_perf(config_file(tmp_path, data))
    assert len(w.prompts) == 12


def test_lengths_are_drawn_in_inference_perfs_order(tmp_path):
    """System lengths for every group, then per group its question and output lengths, from one seeded generator."""
    dist = {"min": 5, "max": 50, "mean": 20, "std_dev": 8}
    w = load_inference_perf(
        config_file(tmp_path, shared(system_prompt_len=dist, question_len=dist, output_len=dist, seed=9))
    )
    rng = np.random.default_rng(9)
    d = Distribution(**dist)
    system = sample(d, 3, rng)
    expected = []
    for g in range(3):
        questions, outputs = sample(d, 4, rng), sample(d, 4, rng)
        expected += [(int(system[g]), int(q), int(o)) for q, o in zip(questions, outputs)]
    got = []
    for p, o in zip(w.prompts, w.output_lens):
        group = [x for x in w.prompts if x[0] == p[0]]  # the prompts of its group start with its system prompt
        shared_len = next(i for i in range(len(p)) if any(len(x) <= i or x[i] != p[i] for x in group))
        got.append((shared_len, len(p) - shared_len, o))
    assert sorted(got) == sorted(expected)


def test_random_data_takes_the_ith_length_each_stage(tmp_path):
    data = {
        "data": {
            "type": "random",
            "input_distribution": {"min": 10, "max": 100, "mean": 50, "std_dev": 20, "total_count": 40},
            "output_distribution": {"min": 2, "max": 9, "mean": 5, "std_dev": 2, "total_count": 40},
        },
        "load": {"type": "poisson", "base_seed": 5, "stages": [{"rate": 4, "duration": 5}, {"rate": 4, "duration": 5}]},
    }
    w = load_inference_perf(config_file(tmp_path, data))
    rng = np.random.default_rng(5)
    inputs = generate(Distribution(min=10, max=100, mean=50, std_dev=20, total_count=40), 40, rng)
    requests = w.requests()
    assert [r.prompt_len for r in requests[:20]] == list(inputs[:20]) == [r.prompt_len for r in requests[20:]]
    assert len({r.prompt_token_ids[:1] for r in requests}) == 40  # fresh text every time: nothing shared
    data["load"]["stages"][0]["duration"] = 50  # 200 requests, 40 lengths
    with pytest.raises(WorkloadError, match="load.stages.0: 200 requests, but only 40 lengths"):
        load_inference_perf(config_file(tmp_path, data))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"data": {"type": "shareGPT"}}, "field data.type: data type 'shareGPT' is not reproduced"),
        ({"load": {"type": "concurrent", "stages": [{"rate": 1, "duration": 1}]}}, "load.type"),
        ({"load": {"stages": [{"rate": -1, "duration": 1}]}}, "load.stages.0.rate"),
        ({"data": {"type": "shared_prefix", "shared_prefix": {"num_groupz": 3}}}, "data.shared_prefix.num_groupz"),
        ({"data": {"type": "random"}}, "random needs input_distribution with a total_count"),
    ],
)
def test_a_bad_config_names_its_file_and_field(tmp_path, change, message):
    path = config_file(tmp_path, {**shared(), **change})
    with pytest.raises(WorkloadError, match=message) as err:
        load_inference_perf(path)
    assert str(path) in str(err.value)


def test_the_cli_refuses_a_bad_config_in_one_line(tmp_path):
    path = config_file(tmp_path, {**shared(), "data": {"type": "otel_trace_replay"}})
    result = subprocess.run([ENGINE, "run", "--workload", str(path), "-q"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and str(path) in result.stderr and len(result.stderr.strip().splitlines()) == 1


def drive(workload, config: EngineConfig | None = None, profile=UNIT):
    engine = Engine(
        config
        or EngineConfig(
            vllm_engine="v1",
            enable_prefix_caching=True,
            max_num_seqs=16,
            max_num_batched_tokens=512,
            max_model_len=512,
            num_gpu_blocks=400,
        ),
        "vllm-v1",
        SimulatedExecutor(profile),
    )
    workload.drive(engine)
    return engine


def test_a_stage_starts_once_the_last_has_drained(tmp_path):
    w = load_inference_perf(config_file(tmp_path, shared(output_len=40)))
    engine = drive(w)
    first = {s: min(c.sent for c in w.client_log if c.stage == s) for s in (0, 1)}
    done = max(g.finish_time for g in engine.finished if g.request_id.startswith("s0-"))
    assert first[1] >= done + 1.0 + STAGE_START_S  # interval (1 s) and inference-perf's own start
    assert all(c.outcome == "ok" for c in w.client_log) and len(w.client_log) == 30
    assert engine.leaked_blocks == 0


def test_multi_turn_rounds_wait_for_each_other_and_carry_their_context(tmp_path):
    w = load_inference_perf(config_file(tmp_path, shared(enable_multi_turn_chat=True, output_len=30)))
    engine = drive(w)
    groups = {g.request_id: g for g in engine.finished}
    for s in (0, 1):
        for index in range(12, len([c for c in w.client_log if c.stage == s])):
            before, after = groups[f"s{s}-{index - 12}"], groups[f"s{s}-{index}"]  # the same user, one round apart
            assert after.arrival_time >= before.finish_time  # sent once the round before answered
            context = before.request.prompt_token_ids + tuple(before.seqs[0].output)
            assert after.request.prompt_token_ids == context + w.prompts[index % 12]
            assert after.request.session_id == before.request.session_id
    assert groups["s1-0"].request.prompt_token_ids == w.prompts[0]  # sessions restart at each stage
    # a round finds its context in the prefix cache: the last round's prompt and answer but its final token, whose
    # KV was never computed (50 + 29 tokens: four full blocks of 16)
    assert groups["s0-12"].num_prefix_hit_tokens == 64


def test_the_client_gives_up_and_vllm_frees_the_blocks(tmp_path):
    data = shared(output_len=200)
    data["load"]["request_timeout"] = 0.5
    w = load_inference_perf(config_file(tmp_path, data))
    engine = drive(w)
    outcomes = {c.outcome for c in w.client_log}
    assert "timeout" in outcomes and engine.leaked_blocks == 0
    timed_out = [c for c in w.client_log if c.outcome == "timeout"]
    assert all(engine._groups[c.request_id].status.name == "FINISHED_ABORTED" for c in timed_out)


def test_too_long_a_request_is_refused(tmp_path):
    w = load_inference_perf(config_file(tmp_path, shared(output_len=500)))  # 50 + 500 > max_model_len 512
    drive(w)
    assert {c.outcome for c in w.client_log} == {"refused"}


@settings(max_examples=25, deadline=None)
@given(
    rates=st.lists(st.floats(0.5, 20), min_size=1, max_size=3),
    duration=st.integers(1, 5),
    groups=st.integers(1, 4),
    per=st.integers(1, 4),
    kind=st.sampled_from(["constant", "poisson"]),
    seed=st.integers(0, 99),
)
def test_every_stage_sends_rate_times_duration_in_order(tmp_path_factory, rates, duration, groups, per, kind, seed):
    data = shared(num_groups=groups, num_prompts_per_group=per)
    data["load"] = {"type": kind, "stages": [{"rate": r, "duration": duration} for r in rates]}
    w = load_inference_perf(config_file(tmp_path_factory.mktemp("ip"), data), seed=seed)
    requests = w.requests()
    assert len(requests) == sum(int(r * duration) for r in rates) == w.num_requests
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(requests, requests[1:]))
    for stage in range(len(rates)):
        mine = [r for r in requests if r.request_id.startswith(f"s{stage}-")]
        assert [r.prompt_token_ids for r in mine] == [w.prompts[i % (groups * per)] for i in range(len(mine))]
        if kind == "constant" and mine:
            start = mine[0].arrival_time
            assert mine[-1].arrival_time - start <= duration


def test_build_workload_reads_a_yaml_and_refuses_rate_options(tmp_path):
    path = config_file(tmp_path, shared())
    assert build_workload(str(path), num_requests=7).num_requests == 7
    with pytest.raises(WorkloadError, match="sets its own load stages"):
        build_workload(str(path), rate=3.0)
