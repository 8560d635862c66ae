"""Calibration: the recorder sees pre-step features, and the fit recovers a known profile."""

import pytest

from kvsched.executors.calibration import (
    CalibrationError,
    StepRecord,
    StepRecorder,
    fit_errors,
    fit_profile,
    load_records,
    save_records,
)
from kvsched.executors.cost_model import LLAMA2_7B_A100
from kvsched.experiments.simulation import run_simulation
from kvsched.workloads.embedded import SyntheticWorkload


@pytest.fixture(scope="module")
def recorded():
    rec = StepRecorder()
    run_simulation(SyntheticWorkload(num_requests=120, seed=3).requests(), on_step=rec)
    return rec.records


def test_recorder_sees_features_before_the_step_applies(recorded):
    first = recorded[0]
    assert first.prefill_tokens > 0 and first.kv_tokens_read == 0  # a cold prompt reads no cache
    second = recorded[1]
    assert second.prefill_tokens == 0 and second.kv_tokens_read == first.prefill_tokens * second.decode_seqs


def test_fit_recovers_the_profile_that_produced_the_durations(recorded):
    fitted = fit_profile(recorded, "refit", kv_bytes_per_token=LLAMA2_7B_A100.kv_bytes_per_token)
    assert fitted.base_ms == pytest.approx(LLAMA2_7B_A100.base_ms, rel=1e-6)
    assert fitted.prefill_token_ms == pytest.approx(LLAMA2_7B_A100.prefill_token_ms, rel=1e-6)
    assert fitted.decode_seq_ms == pytest.approx(LLAMA2_7B_A100.decode_seq_ms, rel=1e-6)
    assert fitted.kv_token_ms == pytest.approx(LLAMA2_7B_A100.kv_token_ms, rel=1e-6)
    assert fit_errors(fitted, recorded)["mape"] < 1e-9


def test_fit_is_non_negative_and_minimises_relative_error():
    # t = 5 + 0.5·P exactly, plus one noisy point; no decode or KV dependence.
    recs = [StepRecord(p, 0, 0, 0, 0, (5 + 0.5 * p) / 1000) for p in (1, 10, 100, 1000)]
    recs.append(StepRecord(0, 4, 0, 0, 0, 0.004))  # 4 ms for 4 decodes: c would want to go negative
    prof = fit_profile(recs, "nn")
    assert min(prof.base_ms, prof.prefill_token_ms, prof.decode_seq_ms, prof.kv_token_ms) >= 0


def test_round_trip_and_malformed(tmp_path, recorded):
    path = save_records(recorded[:10], tmp_path / "steps.csv")
    assert load_records(path) == recorded[:10]
    bad = tmp_path / "bad.csv"
    bad.write_text(path.read_text() + "1,2,three,0,0,0.1\n")
    with pytest.raises(CalibrationError, match=r"bad\.csv:12: column 'kv_tokens_read': not an integer: 'three'"):
        load_records(bad)
    with pytest.raises(CalibrationError, match="need at least 4"):
        fit_profile(recorded[:2], "few")
