"""vLLM V1's scheduling features in kvsched, beyond the step-by-step comparison with vLLM
(tests/test_vllm_v1_differential.py): what the engine reports for them and how a run ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched import Engine, EngineConfig, Request, SamplingParams, hookimpl
from kvsched.core.decisions import Outcome
from kvsched.core.sequence import SequenceStatus
from kvsched.core.view import GroupView, group_of
from kvsched.executors.cost_model import LLAMA2_7B_A100
from kvsched.executors.settings import fit_to_profile
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.metrics.requests import RequestMetrics
from kvsched.policies.vllm_v1 import VllmV1

ENGINE = str(Path(sys.executable).with_name("engine"))


def _group(engine: Engine, request_id: str):
    """The engine's own group behind ``engine.groups[request_id]`` (a view there, or the group itself)."""
    g = engine.groups[request_id]
    return group_of(g) if isinstance(g, GroupView) else g


def _engine(vllm_engine: str, policy: str = "vllm-v1", **config) -> Engine:
    base = dict(
        block_size=4,
        num_gpu_blocks=64,
        max_model_len=64,
        max_num_batched_tokens=64,
        max_num_seqs=16,
        enable_prefix_caching=True,
    )
    return Engine(
        EngineConfig(**{**base, **config}, vllm_engine=vllm_engine, audit_every_step=True), policy, SimulatedExecutor()
    )


def _n3(rid: str = "a", output_len: int = 5) -> Request:
    return Request(request_id=rid, prompt_len=14, output_len=output_len, sampling=SamplingParams(n=3, max_tokens=8))


def test_n_above_one_is_one_request_with_n_outputs_under_v1_as_under_v0():
    """V1 runs the three samples as three requests; the engine still reports one request with
    three outputs, as a v0 group does: same tokens, state and counts."""
    records = {}
    for mechanics, policy in (("v0", "vllm-default"), ("v1", "vllm-v1")):
        engine = _engine(mechanics, policy)
        seen = set()
        finished = []
        engine.run(
            [_n3(), Request(request_id="b", prompt_len=6, output_len=3)],
            on_step=lambda r: (
                seen.update(sg.group.request_id for sg in r.output.scheduled),
                finished.extend(g.request_id for g in r.finished),
            ),
        )
        assert sorted(engine._groups) == ["a", "b"] and sorted(finished) == ["a", "b"] and engine.leaked_blocks == 0
        parent = engine._groups["a"]
        assert [len(s.output) for s in parent.seqs] == [5, 5, 5]
        records[mechanics] = RequestMetrics.of(parent)
        if mechanics == "v1":
            assert seen == {"0_a", "1_a", "2_a", "b"}  # vLLM's child ids
    for field in ("request_id", "status", "finish_reason", "n", "prompt_tokens", "output_tokens"):
        assert getattr(records["v0"], field) == getattr(records["v1"], field), field
    assert records["v1"].output_tokens == 15 and records["v1"].ttft is not None and records["v1"].e2e is not None


def test_the_children_share_the_prompt_through_the_prefix_cache():
    engine = _engine("v1")
    engine.add_request(_n3())
    report = engine.step()  # the three prompts run in one step; the later two find the first's full blocks
    assert [(sg.group.request_id, sg.num_cached_tokens) for sg in report.output.scheduled] == [
        ("0_a", 0),
        ("1_a", 12),
        ("2_a", 12),
    ]


def test_aborting_a_fanned_out_request_ends_every_child_and_frees_their_blocks():
    engine = _engine("v1")
    engine.add_request(_n3(output_len=8))
    engine.step()
    engine.step()
    assert engine.abort("a") and not engine.abort("a")
    assert engine._groups["a"].status is SequenceStatus.FINISHED_ABORTED and not engine.has_unfinished()
    assert engine.leaked_blocks == 0 and engine.finished == [engine._groups["a"]]
    engine.check()


def test_engine_run_with_vllm_v1_runs_the_embedded_workload_to_the_end(tmp_path):
    """Issue 21: its n > 1 requests made the run stop ('chunked prefill ... with several sequences')."""
    res = subprocess.run(
        [ENGINE, "run", "--policy", "vllm-v1", "-o", str(tmp_path), "-q"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["finished"] + summary["ignored"] == summary["num_requests"] == 400 and summary["leaked_blocks"] == 0


def test_without_chunked_prefill_the_budget_holds_the_model_length_as_vllm_sets_it():
    """vLLM raises an unset max_num_batched_tokens to max_model_len when chunked prefill is off,
    and refuses a smaller one it is given (``SchedulerConfig.verify_max_model_len``)."""
    assert fit_to_profile(EngineConfig(), LLAMA2_7B_A100, VllmV1).max_num_batched_tokens == 2048
    config = fit_to_profile(EngineConfig(enable_chunked_prefill=False), LLAMA2_7B_A100, VllmV1)
    assert (config.max_model_len, config.max_num_batched_tokens) == (4096, 4096)
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        EngineConfig(
            vllm_engine="v1",
            enable_chunked_prefill=False,
            max_num_batched_tokens=512,
            max_num_seqs=8,
            max_model_len=1024,
        )
    EngineConfig(
        vllm_engine="v0", enable_chunked_prefill=False, max_num_batched_tokens=512, max_num_seqs=8, max_model_len=1024
    )


class AdmitsEveryone:
    """Offers every waiting request, whatever its state, and records what the core answered."""

    name = "admits-everyone"

    def __init__(self) -> None:
        self.answers = []

    @hookimpl
    def select_batch(self, step):
        step.advance_running()
        self.answers.append({g.request_id: step.admit(g).value for g in step.waiting})
        return True


def test_under_v1_the_core_refuses_a_request_whose_grammar_is_not_ready():
    """The core enforces what vllm-v1 decides: a policy that offers a structured-output request too
    early gets LATER (V1's WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR), and the request keeps its place."""
    policy = AdmitsEveryone()
    config = EngineConfig(
        block_size=4, num_gpu_blocks=32, max_model_len=64, max_num_batched_tokens=64, max_num_seqs=8, vllm_engine="v1"
    )
    engine = Engine(config, policy, SimulatedExecutor())
    engine.add_request(Request(request_id="json", prompt_len=5, output_len=2, grammar_compile_s=0.05))
    engine.add_request(Request(request_id="plain", prompt_len=5, output_len=2))
    engine.step()
    assert policy.answers[0] == {"json": Outcome.LATER.value, "plain": Outcome.SCHEDULED.value}
    assert [v.request_id for v in engine.waiting] == ["json"]
    engine.run()
    assert engine._groups["json"].status is SequenceStatus.FINISHED_STOPPED
    assert engine._groups["json"].first_scheduled_time >= 0.05


@pytest.mark.parametrize("vllm_engine", ["v0", "v1"])
def test_admitting_a_view_that_shows_nothing_is_refused_by_name_under_either_mechanics(vllm_engine):
    """V1's grammar check reads the group before the admission resolves it: a view of no engine's request (made by the
    policy, or let go) is refused as under v0, by name, not as an AttributeError of the core's."""
    from kvsched.errors import PolicyError

    class AdmitsAViewOfNothing:
        name = "admits-a-view-of-nothing"

        @hookimpl
        def select_batch(self, step):
            step.admit(GroupView())

    engine = _engine(vllm_engine, AdmitsAViewOfNothing)
    engine.add_request(Request(request_id="a", prompt_len=5, output_len=2))
    with pytest.raises(PolicyError, match="admit: <a GroupView that shows nothing> is not a request of this engine"):
        engine.step()
    assert [v.request_id for v in engine.waiting] == ["a"] and engine.check() is None


def test_speculative_decoding_with_an_executor_that_rejects_every_draft_changes_only_the_steps():
    """The simulator samples one token per decode, so every draft is rejected and rolled back: the
    requests end with the same tokens as without drafts, after steps that ran ``1 + k`` tokens each."""
    runs = {}
    for k in (0, 3):
        engine = _engine("v1", num_speculative_tokens=k)
        widths = []
        engine.run(
            [Request(request_id=f"r{i}", prompt_len=5 + i, output_len=6) for i in range(4)],
            on_step=lambda r: widths.extend(sg.num_tokens for sg in r.output.scheduled if not sg.is_prefill),
        )
        assert engine.leaked_blocks == 0
        runs[k] = ({rid: [len(s.output) for s in _group(engine, rid).seqs] for rid in engine.groups}, set(widths))
    assert runs[0][0] == runs[3][0] and runs[0][1] == {1} and runs[3][1] == {4}
    assert _engine("v0", "vllm-default", num_speculative_tokens=3).scheduler.drafting is None  # modelled on V1 only


def test_engine_run_takes_the_v1_knobs_from_the_command_line(tmp_path):
    """``--set`` gives them before the policy's engine defaults (vllm_engine v1) apply."""
    res = subprocess.run(
        [
            ENGINE,
            "run",
            "--policy",
            "vllm-v1",
            "-n",
            "40",
            "--set",
            "num_speculative_tokens=2",
            "--set",
            "enable_chunked_prefill=false",
            "-o",
            str(tmp_path),
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["num_speculative_tokens"] == 2 and summary["leaked_blocks"] == 0


def test_vllm_release_033_lets_the_requests_after_a_self_preempted_one_run_in_its_step():
    """``vllm_release``: two prompts in one-token chunks fill the cache; r0 (the least urgent, first of
    a tie) preempts itself. From 0.33 the step goes on and runs r1; up to 0.32 it ends there."""

    def step_of_the_preemption(release: str) -> dict[str, int]:
        engine = Engine(
            EngineConfig(
                vllm_engine="v1",
                block_size=2,
                num_gpu_blocks=5,
                max_model_len=8,
                max_num_seqs=4,
                max_num_batched_tokens=8,
                watermark=0.0,
                audit_every_step=True,
            ),
            "vllm-v1",
            SimulatedExecutor(),
            policy_options={"policy": "priority", "long_prefill_token_threshold": 1, "vllm_release": release},
        )
        for i in range(2):
            engine.add_request(
                Request(
                    request_id=f"r{i}",
                    prompt_token_ids=(i + 1,) * 5,
                    output_len=1,
                    sampling=SamplingParams(max_tokens=1),
                )
            )
        while True:
            report = engine.step()
            if report.output.preempted:
                return {sg.group.request_id: sg.num_tokens for sg in report.output.scheduled}

    assert step_of_the_preemption("0.32") == step_of_the_preemption("0.30") == {}
    assert step_of_the_preemption("0.33") == step_of_the_preemption("0.34.1") == {"r1": 1}
    with pytest.raises(ValueError, match="vllm_release must be a vLLM release"):
        VllmV1(vllm_release="latest")


@pytest.mark.parametrize(("release", "chunk"), [("0.30", 2), ("0.31", 7)])
def test_vllm_release_030_cuts_a_lone_prompt_to_the_threshold_and_later_ones_do_not(release, chunk):
    """vLLM 0.30 applies ``long_prefill_token_threshold`` to every prefill; from 0.31 only when more than
    one request is eligible, so a request alone runs its prompt whole."""
    engine = Engine(
        EngineConfig(
            vllm_engine="v1",
            block_size=4,
            num_gpu_blocks=16,
            max_model_len=16,
            max_num_seqs=4,
            max_num_batched_tokens=16,
            watermark=0.0,
            audit_every_step=True,
        ),
        "vllm-v1",
        SimulatedExecutor(),
        policy_options={"long_prefill_token_threshold": 2, "vllm_release": release},
    )
    engine.add_request(Request(request_id="alone", prompt_len=7, output_len=2, sampling=SamplingParams(max_tokens=2)))
    assert [sg.num_tokens for sg in engine.step().output.scheduled] == [chunk]


@pytest.mark.parametrize(("release", "first"), [("0.30", "json"), ("0.31", "plain")])
def test_vllm_release_030_offers_a_structured_output_request_first_under_fcfs(release, first):
    """vLLM 0.30 keeps a request that arrives waiting for its grammar in a queue of its own, which fcfs
    serves first once the grammar is ready; from 0.31 it keeps its place in the one waiting queue."""
    engine = Engine(
        EngineConfig(
            vllm_engine="v1",
            block_size=4,
            num_gpu_blocks=16,
            max_model_len=16,
            max_num_seqs=1,
            max_num_batched_tokens=16,
            watermark=0.0,
            audit_every_step=True,
        ),
        "vllm-v1",
        SimulatedExecutor(),
        policy_options={"vllm_release": release},
    )
    engine.add_request(Request(request_id="plain", prompt_len=3, output_len=2, sampling=SamplingParams(max_tokens=2)))
    engine.add_request(
        Request(
            request_id="json", prompt_len=3, output_len=2, sampling=SamplingParams(max_tokens=2), grammar_compile_s=0.0
        )
    )
    assert [sg.group.request_id for sg in engine.step().output.scheduled] == [first]


@pytest.mark.parametrize(("release", "chunks"), [("0.33", [3, 3]), ("0.34", [7, 7])])
def test_vllm_release_034_cuts_at_the_threshold_only_with_chunked_prefill(release, chunks):
    """Without chunked prefill vLLM 0.33 still cut a waiting prompt at ``long_prefill_token_threshold``
    (before its whole-prompt check); 0.34 ignores the threshold then: a prompt runs whole or waits."""
    engine = Engine(
        EngineConfig(
            vllm_engine="v1",
            block_size=4,
            num_gpu_blocks=16,
            max_model_len=16,
            max_num_seqs=4,
            max_num_batched_tokens=16,
            watermark=0.0,
            enable_chunked_prefill=False,
            audit_every_step=True,
        ),
        "vllm-v1",
        SimulatedExecutor(),
        policy_options={"long_prefill_token_threshold": 3, "vllm_release": release},
    )
    for rid in ("a", "b"):
        engine.add_request(Request(request_id=rid, prompt_len=7, output_len=2, sampling=SamplingParams(max_tokens=2)))
    assert [sg.num_tokens for sg in engine.step().output.scheduled] == chunks


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vllm_release": "0.33", "cache_aware_admission_window": 16}, "is vLLM 0.34's; vllm_release='0.33' has none"),
        ({"vllm_release": "0.34", "cache_aware_admission_window": -1}, "must be >= 0"),
        ({"vllm_release": "0.34", "cache_aware_admission_threshold": 1.5}, "within 0..1"),
    ],
)
def test_cache_aware_admission_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        VllmV1(**options)
