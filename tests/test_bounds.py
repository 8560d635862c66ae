"""Numbers with bounds at every edge where one enters (issue 21, item 6).

A cost profile's numbers are finite and bounded so that a run's sums stay finite; token counts are
bounded so that no sum a run takes leaves int64; ``Engine.run(max_steps=...)`` is a positive int;
the CLI's counts are bounded before anything is built; and formatting an error never fails, whatever
a plugin hands over (an int too long for ``str()``, a ``__repr__`` that raises, a lone surrogate).
"""

from __future__ import annotations

import enum
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import req
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kvsched.core.config import EngineConfig, PreemptionMode
from kvsched.core.engine import Engine
from kvsched.core.hookspecs import hookimpl
from kvsched.core.request import MAX_TOKENS, Request, SamplingParams
from kvsched.errors import PolicyError, error_text, quote
from kvsched.executors.calibration import CalibrationError, StepRecord, fit_profile
from kvsched.executors.cost_model import LLAMA2_7B_A100, CostProfile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.experiments.compare import MAX_SEEDS, seed_workloads
from kvsched.experiments.simulation import run_simulation
from kvsched.metrics.decision_log import DecisionLog
from kvsched.metrics.requests import RequestMetrics, exact_sum, summarize
from kvsched.policies.vllm_default import VllmDefault
from kvsched.workloads import build_workload
from kvsched.workloads.embedded import SyntheticWorkload
from kvsched.workloads.errors import WorkloadError
from kvsched.workloads.synthetic import SyntheticSpec

ENGINE = str(Path(sys.executable).parent / "engine")
FIELDS = ("base_ms", "prefill_token_ms", "decode_seq_ms", "kv_token_ms", "swap_gb_per_s", "copy_gb_per_s")
REQUESTS = [req(f"r{i}", 40, 6, arrival=0.01 * i) for i in range(6)]
SMALL = EngineConfig(
    num_gpu_blocks=8, num_cpu_blocks=8, block_size=16, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=64
)


def _line(proc: subprocess.CompletedProcess) -> str:
    """The one line a bad input gets: exit 2, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


def _engine(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------- cost profiles
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=st.floats())
@example(field="base_ms", value=math.inf)
@example(field="kv_token_ms", value=1e306)
@example(field="swap_gb_per_s", value=5e-324)
def test_any_float_in_a_profile_is_refused_or_gives_a_summary_that_is_valid_json(field, value):
    """inf, NaN, 1e306, a subnormal bandwidth: refused as the profile loads, or the whole run's summary is JSON."""
    fields = {**LLAMA2_7B_A100.model_dump(exclude={"kv_memory"}), "kv_memory": None, field: value}
    try:
        profile = CostProfile.model_validate(fields)
    except ValidationError:
        return
    config = SMALL.model_copy(update={"preemption_mode": PreemptionMode.SWAP})
    growing = [
        req(f"g{i}", 30, 20, arrival=0.001 * i) for i in range(6)
    ]  # they outgrow the GPU blocks: swaps, so the bandwidths count
    summary = run_simulation(growing, config=config, profile=profile).summary
    assert summary["preemptions"]["swap"] > 0
    json.dumps(summary, allow_nan=False)


def test_a_profile_past_its_bounds_is_one_line_before_the_run(tmp_path):
    fields = {**LLAMA2_7B_A100.model_dump(exclude={"kv_memory"}), "prefill_token_ms": 1e306}
    (tmp_path / "p.json").write_text(json.dumps(fields))
    assert "prefill_token_ms: Input should be less than or equal to" in _line(
        _engine("run", "--profile", str(tmp_path / "p.json"), "-n", "20", "-q", "-o", str(tmp_path / "out"))
    )
    assert not (tmp_path / "out").exists()


def test_a_profile_s_device_memory_is_finite():
    memory = LLAMA2_7B_A100.kv_memory.model_dump()
    with pytest.raises(ValidationError, match="device_gib"):
        CostProfile.model_validate({**LLAMA2_7B_A100.model_dump(), "kv_memory": {**memory, "device_gib": math.inf}})


_STEPS = [(1, 1), (10, 2), (100, 3), (5, 7), (50, 1)]


def test_a_fit_beyond_the_profile_bounds_is_a_calibration_error():
    records = [StepRecord(p, d, 10 * d, 0, 0, 0.01 * (1 + p + d)) for p, d in _STEPS]
    with pytest.raises(
        CalibrationError, match="the fitted profile is invalid: swap_gb_per_s: .* greater than or equal to"
    ):
        fit_profile(records, "no-bandwidth", swap_gb_per_s=0.0)
    fit_profile(records, "fine")


@pytest.mark.parametrize(
    "step", [(1, 1, 10, 1e300, 0), (2**40, 1, 10, 1.0, 0), (1, 1, 2**63, 1.0, 0), (2, 1, 10, 1.0, 2**63)]
)
def test_a_recorded_step_beyond_any_profile_is_named(step):
    """A duration of 1e300 s (whose squares overflow the fit) or a count no step holds: the step is named."""
    p, d, k, seconds, pairs = step
    records = [StepRecord(p, d, k, 0, 0, seconds, pairs)] + [
        StepRecord(p, d, 10 * d, 0, 0, 0.01 * (1 + p + d)) for p, d in _STEPS
    ]
    with pytest.raises(CalibrationError, match="recorded step 1: .* beyond any profile|recorded step 1: more tokens"):
        fit_profile(records, "huge")


# ---------------------------------------------------------------------------------------- token counts
@pytest.mark.parametrize(
    "fields",
    [
        {"prompt_len": 2**62},
        {"prompt_len": 4, "output_len": MAX_TOKENS + 1, "sampling": {"max_tokens": MAX_TOKENS + 1}},
    ],
)
def test_a_request_holds_at_most_max_tokens(fields):
    with pytest.raises(ValidationError):
        Request.model_validate({"request_id": "x", **fields})
    Request(request_id="x", prompt_len=MAX_TOKENS, sampling=SamplingParams(max_tokens=MAX_TOKENS))


@pytest.mark.parametrize("name", ["block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len"])
def test_the_engine_s_token_settings_are_at_most_max_tokens(name):
    with pytest.raises(ValidationError, match=f"{name}\n  Input should be less than or equal to {MAX_TOKENS}"):
        EngineConfig.model_validate({"max_num_batched_tokens": 2**62, name: 2**62})


def test_a_trace_of_huge_prompts_is_one_line_not_an_overflowed_column(tmp_path):
    """Three 2**62-token prompts (with a 2**62-token block they once ran, and their sums wrapped int64): refused as
    read."""
    trace = tmp_path / "big.csv"
    trace.write_text("arrival_time_s,prompt_tokens,output_tokens\n" + "".join(f"0,{2**62},1\n" for _ in range(3)))
    assert "big.csv:2: column 'prompt_tokens': must be <= 2147483648" in _line(
        _engine("run", "--trace", str(trace), "-q")
    )


@pytest.mark.parametrize(
    "length",
    [
        {"kind": "fixed", "value": MAX_TOKENS + 1},
        {"kind": "uniform", "low": 1, "high": 2**62},
        {"kind": "lognormal", "median": 1e300, "sigma": 1},
        {"kind": "lognormal", "median": 100, "sigma": 1e3},
        {"kind": "empirical", "values": [5, 2**62]},
    ],
)
def test_a_synthetic_length_is_bounded_as_the_spec_loads(length):
    """Refused with the spec, not as a request is made in the middle of the run (or an overflow in exp)."""
    with pytest.raises(ValidationError):
        SyntheticSpec.model_validate({"prompt": length})


def test_a_prefix_trace_s_lengths_are_at_most_max_prompt_ids(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 2**40, "output_length": 1, "hash_ids": [1]}) + "\n")
    with pytest.raises(WorkloadError, match="t.jsonl:1: column 'input_length': must be an integer from 1 to 1,048,576"):
        build_workload(None, trace).requests()


def test_a_small_hash_id_trace_cannot_expand_to_gigabytes(tmp_path):
    """An 11 KB trace of 2**31-token lines at 2**20 tokens an id once made a MemoryError: a prompt made of ids
    holds at most MAX_PROMPT_IDS of them, and an id stands for at most 4,096 tokens, so what a line can make is
    bounded by its length."""
    line = {"timestamp": 0, "input_length": 2**31, "output_length": 1, "hash_ids": [0] * 2048}
    (tmp_path / "t.jsonl").write_text(json.dumps(line) + "\n")
    assert (tmp_path / "t.jsonl").stat().st_size < 11_000
    (tmp_path / "huge.json").write_text(
        json.dumps({"kind": "prefix-trace", "path": "t.jsonl", "hash_block_size": 2**20})
    )
    assert "hash_block_size: Input should be less than or equal to 4096" in _line(
        _engine("run", "-q", "-w", tmp_path / "huge.json")
    )
    (tmp_path / "most.json").write_text(
        json.dumps({"kind": "prefix-trace", "path": "t.jsonl", "hash_block_size": 4096})
    )
    start = time.perf_counter()
    assert "column 'input_length': must be an integer from 1 to 1,048,576" in _line(
        _engine("run", "-q", "-w", tmp_path / "most.json")
    )
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize(
    "spec, args, said",
    [
        ({"num_sessions": 3}, ["-n", "2000000"], "num_sessions: Input should be less than or equal to 1000000"),
        (
            {"num_sessions": 1_000_000, "turns": {"kind": "fixed", "value": 20}},
            [],
            "make up to 20,000,000 requests; at most 10,000,000",
        ),
        ({"num_sessions": 3, "max_context": 2**31}, [], "max_context: Input should be less than or equal to 1048576"),
        ({"num_sessions": 3, "rate": 1e300}, ["--rate-scale", "1e9"], "rate: Input should be a finite number"),
    ],
)
def test_a_sessions_workload_is_bounded_with_the_command_line_s_numbers_applied(tmp_path, spec, args, said):
    """-n 2000000 once took a sessions workload past its bound (counting its turns, without end in sight), and
    --rate-scale its rate to inf."""
    (tmp_path / "s.json").write_text(json.dumps({"kind": "sessions", **spec}))
    start = time.perf_counter()
    assert said in _line(_engine("run", "-q", "-w", tmp_path / "s.json", *args))
    assert time.perf_counter() - start < 30


def test_a_spec_s_rate_scaled_past_the_floats_is_refused_as_it_loads(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_time_s,prompt_tokens,output_tokens\n0,5,1\n1,5,1\n")
    (tmp_path / "trace.json").write_text(json.dumps({"kind": "trace", "path": "t.csv", "rate_scale": 1e9}))
    assert "rate_scale: Input should be less than or equal to 1000000000" in _line(
        _engine("run", "-q", "-w", tmp_path / "trace.json", "--rate-scale", "10")
    )
    assert "Invalid value for '--rate-scale'" in _line(_engine("run", "-q", "--rate-scale", "1e308"))


@given(values=st.lists(st.integers(0, 2**63 - 1), max_size=40))
def test_a_column_s_sum_is_exact_however_it_adds_up(values):
    """numpy's int64 sum wraps past 2**63 without a word; the summaries' sums do not."""
    assert exact_sum(np.array(values, dtype=np.int64)) == sum(values)


def test_a_summary_s_token_total_does_not_wrap():
    rows = [
        RequestMetrics(
            f"r{i}",
            "FINISHED_STOPPED",
            "stop",
            None,
            0,
            "default",
            1,
            4,
            2**62,
            0.0,
            0.0,
            1.0,
            2.0,
            0.0,
            1.0,
            0.5,
            2.0,
            0,
            0,
        )
        for i in range(3)
    ]
    assert summarize(None, rows)["output_tokens"] == 3 * 2**62


# ---------------------------------------------------------------------------------------- Engine.run
@pytest.mark.parametrize(
    "bad, error",
    [(2.5, TypeError), (math.nan, TypeError), (True, TypeError), ("3", TypeError), (0, ValueError), (-1, ValueError)],
)
def test_max_steps_is_a_positive_int_or_none(bad, error):
    engine = Engine(SMALL, "vllm-default", SimulatedExecutor())
    with pytest.raises(error, match="max_steps must be a positive int or None"):
        engine.run(REQUESTS, max_steps=bad)
    assert engine.num_steps == 0
    engine.run(REQUESTS, max_steps=3)
    assert engine.num_steps == 3


def test_max_steps_may_be_an_int_subclass():
    """An ``IntEnum`` is a count as its int is; only a ``bool`` is refused."""
    engine = Engine(SMALL, "vllm-default", SimulatedExecutor())
    engine.run(REQUESTS, max_steps=enum.IntEnum("Budget", {"THREE": 3}).THREE)
    assert engine.num_steps == 3


class Shifty(int):
    """An int whose ``int()`` answers 5 the first time and -1 after: read twice, the check and the budget differ."""

    reads = 0

    def __int__(self):
        Shifty.reads += 1
        return 5 if Shifty.reads == 1 else -1


def test_max_steps_is_read_once():
    engine = Engine(SMALL, "vllm-default", SimulatedExecutor())
    engine.run(REQUESTS, max_steps=Shifty(7))
    assert engine.num_steps == 5


# ---------------------------------------------------------------------------------------- the CLI's counts
def test_compare_refuses_a_trillion_seeds_at_once():
    start = time.perf_counter()
    assert "--seeds must be between 1 and 1,000" in _line(
        _engine("compare", "-p", "vllm-default", "-p", "fcfs", "--seeds", "1000000000000", timeout=30)
    )
    assert time.perf_counter() - start < 20


@pytest.mark.parametrize(
    "args, said",
    [
        (["--rate", "1e-300"], "rate: Input should be greater than or equal to"),
        (["--rate", "1e300"], "rate: Input should be less than or equal to"),
        (["-w", "synthetic", "--arrival", "gamma", "--cv", "1e200"], "cv: Input should be less than or equal to 100"),
    ],
)
def test_arrival_numbers_are_bounded_before_the_run(args, said):
    """A rate or burstiness whose arrival times leave the floats (inf, or a gamma shape of 0) is refused at once."""
    assert said in _line(_engine("run", "-q", *args))


def test_seed_workloads_are_built_only_as_far_as_they_differ():
    built = []

    def build(seed):
        built.append(seed)
        return SyntheticWorkload(num_requests=5, seed=0)  # a workload that ignores its seed

    assert len(seed_workloads(build, 7, MAX_SEEDS)) == 1 and built == [7, 8]
    with pytest.raises(ValueError, match="--seeds must be between 1 and 1,000, got 1,001"):
        seed_workloads(build, 0, MAX_SEEDS + 1)
    assert len(built) == 2


@pytest.mark.parametrize(
    "option", [["--examples", "1000000000000"], ["--steps", "100000000"], ["--shrink-seconds", "inf"]]
)
def test_engine_check_s_counts_are_bounded(option):
    assert "Input should be less than or equal to" in _line(
        _engine("check", "-p", "vllm-default", "-q", *option, timeout=30)
    )


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "--num-prompts", "1000000000"],
        ["verify", "--threads", "100000"],
        ["run", "--executor", "hf", "--max-tokens", "100000000000"],
        ["run", "--executor", "hf", "--temperature", "inf"],
    ],
)
def test_the_real_model_s_counts_are_bounded_before_a_model_loads(args):
    assert "Input should be less than or equal to" in _line(_engine(*args, "-q", timeout=30))


@pytest.mark.parametrize("option", [["--rounds", "1000000000000"], ["--synthetic", "-1"], ["--rate", "nan"]])
def test_sim_speed_s_counts_are_bounded(option):
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "benchmarks" / "sim_speed.py"), *option],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        proc.returncode == 2 and f"argument {option[0]}: must be from" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_a_sweep_s_grid_is_counted_before_it_is_built():
    values = ",".join(str(v) for v in range(1, 101))
    sets = [
        a
        for key in ("delay_factor", "max_num_seqs", "watermark", "num_gpu_blocks", "block_size", "num_cpu_blocks")
        for a in ("--set", f"{key}={values}")
    ]
    assert "the sweep has 1,000,000,000,000 points" in _line(_engine("sweep", "-p", "vllm-default", *sets, timeout=30))


# ---------------------------------------------------------------------------------------- error formatting
class _BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


class _SurrogateRepr:
    def __repr__(self):
        return "\udc80" * 10


class _BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no str")


_HUGE = st.integers(4000, 6000).map(lambda digits: 7 * 10**digits + digits)  # around str()'s 4,300-digit limit
ODD = st.one_of(
    st.integers(),
    _HUGE,
    _HUGE.map(lambda n: -n),
    st.floats(),
    st.text(max_size=300),
    st.just("\udc80\ud800"),
    st.builds(_BadRepr),
    st.builds(_SurrogateRepr),
    st.lists(_HUGE, max_size=3),
    st.just({"\udcff": 10**5000}),
)


@settings(max_examples=60)
@given(value=ODD)
def test_quote_and_error_text_never_fail_and_stay_short(value):
    for text in (quote(value), error_text(RuntimeError(value)), error_text(RuntimeError(value, value))):
        assert type(text) is str and len(text) < 400
        text.encode("utf-8")
    assert error_text(_BadStr()) == "<_BadStr whose str() raised>"


@pytest.mark.parametrize("name", ["request_id", "tenant", "session_id", "slo_class"])
def test_a_request_s_names_are_valid_utf8(name):
    """A lone surrogate in a name would fail the results' Parquet at the end of the run ("error: utf-8")."""
    with pytest.raises(ValidationError, match=name):
        Request.model_validate({"request_id": "r", "prompt_len": 4, name: "a\ud800"})
    Request.model_validate({"request_id": "r", "prompt_len": 4, name: "ünïcode"})


def test_the_cli_line_of_a_unicode_error_says_what_failed():
    from kvsched.cli.common import _one_line

    assert _one_line(UnicodeEncodeError("utf-8", "a\udc80", 1, 2, "surrogates not allowed")) == (
        "'utf-8' codec can't encode character '\\udc80' in position 1: surrogates not allowed",
        2,
    )
    assert _one_line(KeyError("no such profile")) == ("no such profile", 2)
    assert _one_line(ValueError(10**5000)) == ("<int of 5,001 digits>", 2)


class _Answers(VllmDefault):
    """Answers can_allocate with ``value``, or raises it from select_batch."""

    name = "answers-oddly"

    def __init__(self, value, raises: bool) -> None:
        super().__init__()
        self.value, self.raises = value, raises

    @hookimpl
    def can_allocate(self, step, group):
        return self.value

    @hookimpl
    def select_batch(self, step):
        if self.raises:
            raise RuntimeError(self.value)
        return super().select_batch(step)


@settings(max_examples=60, deadline=None)
@given(value=ODD, raises=st.booleans())
def test_any_hook_value_gives_a_short_printable_error_naming_the_policy(value, raises):
    engine = Engine(SMALL, _Answers(value, raises), SimulatedExecutor())
    engine.add_request(req("a", 8, 2))
    with pytest.raises(PolicyError) as caught:
        engine.step()
    message = str(caught.value)
    assert message.startswith("policy 'answers-oddly' in ") and len(message) < 600
    message.encode("utf-8")


class _HoldsBack(VllmDefault):
    name = "holds-back"

    def __init__(self, reason, numbers) -> None:
        super().__init__()
        self.reason, self.numbers = reason, numbers

    @hookimpl
    def select_batch(self, step):
        step.hold_back(self.reason, **self.numbers)
        return super().select_batch(step)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reason=st.one_of(st.text(max_size=20), st.just("gate\udc80"), st.just("x" * 300), st.integers()),
    numbers=st.dictionaries(
        st.one_of(st.text(max_size=5), st.just("\udc80")),
        st.one_of(st.floats(), st.integers(), st.just(10**5000), st.just(-(2**63) - 1)),
        max_size=3,
    ),
)
def test_a_hold_back_the_log_cannot_write_is_refused_naming_the_policy(tmp_path, reason, numbers):
    """The decision log takes any hold_back the policy could make, or the policy is named as it makes it."""
    log = DecisionLog(tmp_path / "d.parquet")
    try:
        run_simulation(REQUESTS[:2], _HoldsBack(reason, numbers), SMALL, on_step=log)
    except PolicyError as exc:
        log.discard()
        assert str(exc).startswith("policy 'holds-back' in select_batch: hold_back: ") and len(str(exc)) < 600
        str(exc).encode("utf-8")
        return
    log.close()
