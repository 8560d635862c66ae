"""Attention over the context in the linear step cost (issue 35): a prefill chunk's query-key pairs are a
step feature, counted once for both kinds of profile, charged by ``attention_pair_ms``, fitted by
calibration; a profile without the term (every file written before it) charges what it did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.core.outputs import causal_pairs
from kvsched.core.request import Request, SamplingParams
from kvsched.executors.calibration import StepRecorder, fit_profile, load_records, save_records
from kvsched.executors.cost_model import LLAMA2_7B_A100, CostProfile
from kvsched.executors.profiles import resolve_profile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.executors.step_work import attention_work
from kvsched.experiments.simulation import run_simulation

ENGINE = str(Path(sys.executable).parent / "engine")
PLANTED = CostProfile(
    name="planted",
    base_ms=7.0,
    prefill_token_ms=0.05,
    decode_seq_ms=0.09,
    kv_token_ms=3e-4,
    attention_pair_ms=4e-6,
    kv_bytes_per_token=1024,
    swap_gb_per_s=10,
    copy_gb_per_s=100,
)


def long_config(budget: int, **fields) -> EngineConfig:
    return EngineConfig(
        **{
            "block_size": 16,
            "num_gpu_blocks": 4096,
            "max_num_seqs": 8,
            "max_model_len": 40_000,
            "max_num_batched_tokens": budget,
            "enable_chunked_prefill": True,
            **fields,
        }
    )


def prefill_seconds(profile: CostProfile, prompt: int, budget: int) -> float:
    """The simulated time of one prompt's prefill, chunked by ``budget`` (its first token's time)."""
    request = Request(request_id="long", prompt_len=prompt, output_len=2, sampling=SamplingParams(max_tokens=2))
    result = run_simulation([request], "vllm-v1", long_config(budget), profile=profile)
    return result.requests[0].ttft


def test_a_long_prompts_prefill_costs_its_pairs_however_it_is_chunked():
    """Attention alone (e only): a prompt of N tokens costs e·N(N+1)/2 whatever its chunks, so twice the
    prompt costs four times the time; the 4-term profile charged it linearly."""
    only = CostProfile(
        name="pairs",
        base_ms=0,
        prefill_token_ms=0,
        decode_seq_ms=0,
        kv_token_ms=0,
        attention_pair_ms=1e-6,
        kv_bytes_per_token=0,
        swap_gb_per_s=1,
        copy_gb_per_s=1,
    )
    for prompt in (3_000, 6_000, 12_000):
        for budget in (512, 2048):
            expected = 1e-6 * causal_pairs(0, prompt) / 1000
            assert prefill_seconds(only, prompt, budget) == pytest.approx(expected, rel=1e-9)
    short, long_ = (prefill_seconds(LLAMA2_7B_A100, prompt, 512) for prompt in (16_000, 32_000))
    assert long_ > 2.6 * short  # quadratic attention over linear GEMMs: 4,096 tokens in, it dominates
    linear = LLAMA2_7B_A100.model_copy(update={"attention_pair_ms": 0.0})
    assert prefill_seconds(linear, 32_000, 512) < 2.1 * prefill_seconds(linear, 16_000, 512)


class Recording(SimulatedExecutor):
    """Every step as the executor sees it: the features' pairs, the roofline's count and a recount."""

    def __init__(self, profile):
        super().__init__(profile, block_size=16)
        self.steps = []

    def execute(self, output):
        recount = 0
        if output.prefill_tokens:
            for sg in output.scheduled[output.lane_decodes :]:
                recount += sum(causal_pairs(seq.num_computed_tokens, n) for seq, n in sg.seq_chunks() if n > 1)
        result = super().execute(output)
        self.steps.append((output.features, attention_work(output).prefill_pairs, recount, result.duration))
        return result


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.lists(st.tuples(st.integers(1, 900), st.integers(1, 30), st.integers(0, 2)), min_size=1, max_size=12),
    policy=st.sampled_from(["vllm-v1", "sarathi", "vllm-default"]),
    budget=st.sampled_from([16, 64, 256, 1024]),
    caching=st.booleans(),
    n=st.integers(1, 3),
)
def test_the_linear_and_roofline_kinds_see_the_same_attention_work(prompts, policy, budget, caching, n):
    """Chunks, shared prefixes found in the cache, n > 1 forks, preemptions: at every step the features'
    pairs are the roofline's (one walk, one formula), a recount's, and what the linear profile charges."""
    requests = [
        Request(
            request_id=f"r{i}",
            prompt_token_ids=tuple(range(family * 5000, family * 5000 + 64))
            + tuple(range(100_000 + 1000 * i, 100_000 + 1000 * i + length)),
            output_len=output,
            arrival_time=0.01 * i,
            sampling=SamplingParams(n=n if i % 2 else 1, max_tokens=30),
        )
        for i, (length, output, family) in enumerate(prompts)
    ]
    executor = Recording(PLANTED)
    config = EngineConfig(
        block_size=16,
        num_gpu_blocks=96,
        num_cpu_blocks=64,
        max_num_seqs=6,
        max_model_len=1024,
        max_num_batched_tokens=max(budget, 1024) if policy == "vllm-default" else budget,
        enable_prefix_caching=caching,
    )
    Engine(config, policy, executor).run(requests)
    assert any(pairs for _, pairs, _, _ in executor.steps)
    p = PLANTED
    for features, roofline_pairs, recount, duration in executor.steps:
        assert features.prefill_pairs == roofline_pairs == recount
        if features.prefill_tokens and not (features.blocks_swapped or features.blocks_copied):
            expected = (
                p.base_ms
                + p.prefill_token_ms * features.prefill_tokens
                + p.decode_seq_ms * features.decode_seqs
                + p.kv_token_ms * features.kv_tokens_read
                + p.attention_pair_ms * roofline_pairs
            ) / 1000
            assert duration == pytest.approx(expected, rel=1e-12)


@pytest.fixture(scope="module")
def planted_run():
    """A recorded run of the planted profile on prompts long enough for the pairs to matter."""
    recorder = StepRecorder()
    requests = [
        Request(
            request_id=f"r{i}",
            prompt_len=200 + 977 * i % 6000,
            output_len=20 + 13 * i % 60,
            arrival_time=0.05 * i,
            sampling=SamplingParams(max_tokens=80),
        )
        for i in range(40)
    ]
    run_simulation(requests, "vllm-v1", long_config(1024), profile=PLANTED, on_step=recorder)
    return recorder.records


def test_calibration_recovers_a_planted_attention_coefficient(planted_run, tmp_path):
    assert sum(r.prefill_pairs for r in planted_run) > 0
    fields = ("base_ms", "prefill_token_ms", "decode_seq_ms", "kv_token_ms", "attention_pair_ms")
    for records in (planted_run, load_records(save_records(planted_run, tmp_path / "steps.csv"))):
        fitted = fit_profile(records, "refit")
        for field in fields:
            assert getattr(fitted, field) == pytest.approx(getattr(PLANTED, field), rel=1e-6), field
    proc = subprocess.run(
        [ENGINE, "calibrate", str(tmp_path / "steps.csv"), "-o", str(tmp_path / "refit.json")],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "e (per prefill query-key pair)" in proc.stdout
    written = json.loads((tmp_path / "refit.json").read_text())
    assert written["attention_pair_ms"] == pytest.approx(PLANTED.attention_pair_ms, rel=1e-6)


def test_a_recording_without_pairs_fits_no_attention_term(planted_run, tmp_path):
    """A CSV written before the column loads (each step's pairs 0) and fits the four terms it did."""
    path = save_records(planted_run, tmp_path / "steps.csv")
    old = tmp_path / "old.csv"
    old.write_text("\n".join(",".join(line.split(",")[:6]) for line in path.read_text().splitlines()) + "\n")
    records = load_records(old)
    assert records and all(r.prefill_pairs == 0 for r in records)
    assert fit_profile(records, "old").attention_pair_ms == 0.0


def test_an_old_profile_file_charges_exactly_what_it_did(tmp_path):
    """A profile JSON without attention_pair_ms loads with e = 0, and every step costs the 4-term sum, to
    the bit: chunked long prompts, swaps, decodes (a decode step never has pairs, so the decode lane and
    steady runs are exact with any e)."""
    old = json.loads(LLAMA2_7B_A100.model_dump_json())
    for field in ("attention_pair_ms", "base_ms", "prefill_token_ms", "decode_seq_ms", "kv_token_ms"):
        old.pop(field)
    old.update(base_ms=9.06, prefill_token_ms=0.0666, decode_seq_ms=0.0882, kv_token_ms=2.54e-4)  # the 4-term fit
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    profile = resolve_profile(str(path))
    assert profile.attention_pair_ms == 0.0
    executor = Recording(profile)
    requests = [
        Request(
            request_id=f"r{i}",
            prompt_len=300 + 1500 * (i % 3),
            output_len=300,
            arrival_time=0.0,
            sampling=SamplingParams(max_tokens=300),
        )
        for i in range(8)
    ]
    config = long_config(256, num_gpu_blocks=250, num_cpu_blocks=600, preemption_mode="swap")
    Engine(config, "sarathi", executor).run(requests)  # chunked prefills, and swaps for want of blocks
    block_bytes = 16 * profile.kv_bytes_per_token
    assert any(f.prefill_pairs for f, *_ in executor.steps) and any(f.blocks_swapped for f, *_ in executor.steps)
    for f, _, _, duration in executor.steps:
        if not (f.prefill_tokens or f.decode_seqs or f.blocks_swapped):
            continue
        ms = (
            profile.base_ms
            + profile.prefill_token_ms * f.prefill_tokens
            + profile.decode_seq_ms * f.decode_seqs
            + profile.kv_token_ms * f.kv_tokens_read
        )
        ms += f.blocks_swapped * block_bytes / (profile.swap_gb_per_s * 1e6)
        ms += f.blocks_copied * 2 * block_bytes / (profile.copy_gb_per_s * 1e6)
        assert duration == ms / 1000.0
