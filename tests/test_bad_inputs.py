"""Bad input through the library: refused at the edge with a clear error, never an overflow, a
hang or a silent fallback; and what the engine reports when a plugin fails or stalls."""

from __future__ import annotations

import math

import broken_policies as bp
import pytest
from helpers import req, unit_engine
from pydantic import ValidationError

from kvsched import Engine, EngineConfig, PolicyError, Request, SamplingParams, SimulatedExecutor, StallError, hookimpl
from kvsched.core.sequence import Sequence
from kvsched.policies.vllm_default import VllmDefault


@pytest.mark.parametrize(
    "fields, where",
    [
        ({"prompt_len": 2**63}, "prompt_len"),
        ({"prompt_token_ids": (1, 2**63)}, "prompt_token_ids.1"),
        ({"prompt_len": 4, "priority": 10**20}, "priority"),
        ({"prompt_len": 4, "output_len": 2**63, "sampling": {"max_tokens": 2**63}}, "max_tokens"),
        ({"prompt_len": 4, "arrival_time": math.inf}, "arrival_time"),
        ({"prompt_len": 4, "tenant": ""}, "tenant"),
        ({"prompt_len": 4, "tenant": "  "}, "tenant"),
    ],
)
def test_requests_out_of_range_are_refused_naming_the_field(fields, where):
    with pytest.raises(ValidationError, match=where.replace(".", r"\.")):
        Request(request_id="r", **fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"num_gpu_blocks": 10**20},
        {"num_gpu_blocks": 10**8},
        {"num_cpu_blocks": 10**8},
        {"max_num_batched_tokens": 2**64},
        {"delay_factor": math.inf},
    ],
)
def test_configs_out_of_range_are_refused_before_anything_is_allocated(fields):
    with pytest.raises(ValidationError, match=next(iter(fields))):
        EngineConfig(**fields)


class NoHooks:
    name = "no-hooks"


@pytest.mark.parametrize(
    "policy, message",
    [
        (None, "is None, not a policy"),
        (5, "is 5, not a policy"),
        (False, "is False, not a policy"),
        (NoHooks, "implements no hook"),
        (NoHooks(), "implements no hook"),
    ],
)
def test_what_is_not_a_policy_is_refused_instead_of_running_the_default(policy, message):
    with pytest.raises(PolicyError, match=message):
        Engine(EngineConfig(), policy, SimulatedExecutor())


def test_an_exception_in_a_hook_names_the_hook_and_the_plugins_own_line():
    engine = Engine(EngineConfig(), bp.Raises, SimulatedExecutor())
    for i in range(3):
        engine.add_request(req(f"r{i}", 16, 4))
    with pytest.raises(PolicyError) as caught:
        engine.step()
    text = str(caught.value)
    assert text.startswith(
        "policy 'broken-raises' in select_batch: raised RuntimeError: queue too long for this policy"
    )
    line = next(i for i, s in enumerate(open(bp.__file__), 1) if "queue too long" in s)
    assert text.endswith(f"broken_policies.py:{line})") and caught.value.hook == "select_batch"


def test_an_observer_that_raises_is_named_as_the_observer():
    class Boom:
        @hookimpl
        def on_step(self, report):
            raise KeyError("no-such-request")

    engine = Engine(EngineConfig(), "vllm-default", SimulatedExecutor(), observers=(Boom(),))
    engine.add_request(req("a", 8, 2))
    with pytest.raises(
        PolicyError,
        match=r"^observer 'Boom-0' in on_step: raised KeyError: 'no-such-request' \(at .*test_bad_inputs\.py:\d+\)",
    ):
        engine.step()
    engine.hooks.pm.unregister(name="Boom-0")
    assert engine.scheduler.audit() == [] and engine.num_steps == 1  # the step itself stood


class NeverAdmits(VllmDefault):
    name = "never-admits"

    @hookimpl
    def select_batch(self, step):
        step.advance_running()


def test_a_stall_is_reported_soon_naming_the_oldest_request_and_why():
    engine = Engine(EngineConfig(), NeverAdmits, SimulatedExecutor())
    with pytest.raises(StallError) as caught:
        engine.run([req("first", 40, 4, arrival=0.5), req("second", 40, 4, arrival=0.7)])
    text = str(caught.value)
    assert "the oldest waiting request, first (arrived at 0.500 s)" in text
    assert "fits the KV cache and the budgets now, but policy 'never-admits' does not schedule it" in text
    assert engine.num_steps < 20_000  # the old bound was 100,000 idle steps (minutes of a frozen progress bar)


def test_a_policy_that_waits_for_time_to_pass_is_not_a_stall():
    class AdmitsAfter5s(VllmDefault):
        name = "admits-after-5s"

        @hookimpl
        def select_batch(self, step):
            if step.now >= 5.0:
                super().select_batch(step)

    engine = Engine(EngineConfig(), AdmitsAfter5s, SimulatedExecutor())
    engine.run([req("a", 40, 4)])
    assert engine._groups["a"].status.name == "FINISHED_STOPPED"


def test_a_long_prompt_with_prefix_caching_is_hashed_only_up_to_its_first_miss(monkeypatch):
    calls = []
    slice_tokens = Sequence.token_slice
    monkeypatch.setattr(
        Sequence, "token_slice", lambda self, start, stop: calls.append(start) or slice_tokens(self, start, stop)
    )
    engine = Engine(
        EngineConfig(enable_prefix_caching=True), "lpm", SimulatedExecutor()
    )  # lpm asks for cache hits to order
    engine.add_request(req("huge", 10**6, 4))
    engine.add_request(req("small", 40, 4))
    engine.step()
    assert engine._groups["huge"].status.name == "FINISHED_IGNORED" and len(calls) < 10


def test_the_audit_finds_blocks_held_by_a_finished_sequence():
    engine = unit_engine()
    engine.add_request(req("a", 6, 2))
    engine.run()
    bm, seq = engine.scheduler.block_manager, engine._groups["a"].seqs[0]
    assert engine.scheduler.audit() == []
    bm.gpu_tables[seq.seq_id] = [bm.gpu.allocate()]  # what a rollback across an abort once did
    assert any(f"sequence {seq.seq_id} holds GPU blocks but is not running" in p for p in engine.scheduler.audit())


def test_an_error_quotes_a_huge_value_briefly():
    class HugeAnswer(VllmDefault):
        name = "huge-answer"

        @hookimpl
        def can_allocate(self, step, group):
            return ["OK"] * 10**6

    engine = Engine(EngineConfig(), HugeAnswer, SimulatedExecutor())
    engine.add_request(
        Request(request_id="x" * 10**5, prompt_len=8, output_len=2, sampling=SamplingParams(max_tokens=2))
    )
    with pytest.raises(
        PolicyError, match=r"in can_allocate: returned \['OK', 'OK', 'OK', 'OK', \.\.\.\], expected an AllocStatus"
    ) as caught:
        engine.step()
    assert len(str(caught.value)) < 300
