"""The CPU KV tier (allocators/cpu_tier.py) and its engine side (allocators/offloading.py): no chunk lost between the
tiers, ref counts in range on both, a reload that never exceeds the GPU pool, and the run's counts. Exactness
against vLLM 0.34's own manager is tests/test_cpu_tier_vllm.py's (in the 0.34 venv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import req, unit_engine
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvsched.allocators.cpu_tier import CpuTier
from kvsched.core.config import EngineConfig
from kvsched.core.request import Request, SamplingParams
from kvsched.metrics.requests import RequestMetrics, summarize
from kvsched.policies.vllm_v1 import VllmV1


class TierMachine(RuleBasedStateMachine):
    """Random stores, loads, completions and finishes on one tier: every key it took is held or was reported
    evicted (none vanishes), ref counts stay in -1.., a pinned or write-pending chunk is never evicted."""

    def __init__(self) -> None:
        super().__init__()
        self.tier = CpuTier(5, "lru")
        self.kept: set[int] = set()  # keys the tier said it stored and has not said it evicted
        self.writing: list[int] = []
        self.loading: list[int] = []

    @rule(policy=st.sampled_from(["lru", "arc"]))
    @precondition(lambda self: not self.kept)
    def restart(self, policy):
        self.tier = CpuTier(5, policy)

    @rule(request=st.integers(0, 3), keys=st.lists(st.integers(0, 12), min_size=1, max_size=6, unique=True))
    def store(self, request, keys):
        pinned = {k for k, n in self.tier.ref_counts.items() if n != 0}
        result = self.tier.prepare_store(f"r{request}", keys, 0)
        if result is None:
            return
        stored, evicted = result
        assert not set(evicted) & (pinned | set(keys)), "a pinned, pending or offered chunk was evicted"
        assert set(evicted) <= self.kept
        self.kept = (self.kept - set(evicted)) | set(stored)
        self.writing += stored

    @rule()
    def complete(self):
        self.tier.complete_store(self.writing)
        self.tier.complete_load(self.loading)
        self.writing, self.loading = [], []

    @rule(request=st.integers(0, 3), key=st.integers(0, 12))
    def load(self, request, key):
        if self.tier.is_ready(key):
            self.tier.prepare_load(f"r{request}", [key], 0)
            self.loading.append(key)

    @rule(request=st.integers(0, 3))
    def finish(self, request):
        self.tier.finish(f"r{request}")

    @invariant()
    def nothing_is_lost(self):
        assert set(self.tier.ref_counts) == self.kept
        assert all(n >= -1 for n in self.tier.ref_counts.values())
        assert self.tier.audit() == []


TestTierMachine = TierMachine.TestCase


def _shared(rid: str, prefix: int, own: int, out: int, arrival: float) -> Request:
    """A prompt of ``prefix`` shared tokens then ``own`` tokens of its own."""
    tokens = tuple(range(prefix)) + tuple(10_000 + 100 * int(rid[1:]) + i for i in range(own))
    return Request(
        request_id=rid,
        prompt_token_ids=tokens,
        output_len=out,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=out),
    )


@settings(deadline=None)
@given(
    gpu=st.integers(8, 24),
    cpu=st.integers(1, 40),
    policy=st.sampled_from(["lru", "arc"]),
    prompt_only=st.booleans(),
    shapes=st.lists(
        st.tuples(st.integers(0, 24), st.integers(1, 20), st.integers(1, 12), st.integers(0, 6)), min_size=1, max_size=8
    ),
)
def test_every_step_keeps_both_tiers_whole_and_a_reload_fits_the_gpu_pool(gpu, cpu, policy, prompt_only, shapes):
    eng = unit_engine(
        VllmV1(),
        num_gpu_blocks=gpu,
        enable_prefix_caching=True,
        kv_offloading_blocks=cpu,
        kv_offloading_policy=policy,
        offload_prompt_only=prompt_only,
        max_model_len=64,
    )
    for i, (prefix, own, out, arrival) in enumerate(shapes):
        eng.add_request(_shared(f"r{i}", prefix, own, out, float(arrival)))
    offloading, bm = eng.scheduler.offloading, eng.scheduler.block_manager
    for _ in range(500):
        if not eng.has_unfinished():
            break
        output = eng.schedule()  # checked as the step is scheduled: a request may end in it and free its blocks
        moves = output.blocks_to_swap_in
        if moves:
            event("a step loads from the CPU tier")
        assert len(moves) <= bm.gpu.num_blocks
        assert len({b for _, b in moves}) == len(moves) and len({s for s, _ in moves}) == len(moves)
        assert all(bm.gpu.ref_counts[b] > 0 for _, b in moves), "a loaded block is not held by its request"
        eng.complete(output, eng.executor.execute(output))
        assert offloading.tier.audit() == [] and bm.audit() == []
        assert all(n == 0 or n == -1 for n in offloading.tier.ref_counts.values()), "a load outlived its step"
    assert not eng.has_unfinished()
    left = {request for request, *_ in offloading.finished}  # closed at the next step
    assert (
        bm.gpu.num_free == bm.gpu.num_blocks
        and set(offloading.next_offer) <= left
        and set(offloading.tier.requests) <= left
    )


def _prefix_engine(**config):
    eng = unit_engine(VllmV1(), num_gpu_blocks=12, enable_prefix_caching=True, max_model_len=64, **config)
    eng.add_request(_shared("r0", 16, 4, 2, 0.0))
    eng.add_request(_shared("r1", 0, 40, 2, 3.0))  # takes the whole pool: r0's cached blocks are evicted
    eng.add_request(_shared("r2", 16, 4, 2, 30.0))  # r0's 16-token prefix again
    eng.run([])
    return eng, summarize(eng, [RequestMetrics.of(g) for g in eng.finished])


def test_a_prefix_evicted_from_the_gpu_is_found_in_the_cpu_tier_and_counted_as_its_hit():
    eng, summary = _prefix_engine(kv_offloading_blocks=32)
    tier = summary["cpu_tier"]
    assert tier["cpu_prefix_hit_tokens"] == 16 and tier["loaded_blocks"] == 4  # r2 loads r0's 4 blocks of 4 tokens
    assert tier["gpu_prefix_hit_tokens"] == 0 and summary["blocks_swapped_in"] == 4
    _, without = _prefix_engine()
    assert "cpu_tier" not in without and without["blocks_swapped_in"] == 0


def test_a_preempted_request_reloads_its_prompt_and_recomputes_only_the_rest():
    """a (40 tokens), b (5) and c (21) fill the pool; c is preempted and two of its cached GPU blocks are taken:
    with a CPU tier those two come back from the CPU, and only its last token is computed again."""

    def run(**config):
        eng = unit_engine(VllmV1(), num_gpu_blocks=19, enable_prefix_caching=True, **config)
        for rid, n in (("a", 40), ("b", 5), ("c", 21)):
            eng.add_request(req(rid, n, 6))
        eng.run([])
        return summarize(eng, [RequestMetrics.of(g) for g in eng.finished])

    with_tier, without = run(kv_offloading_blocks=64), run()
    assert without["recompute"]["recomputed_tokens"] > with_tier["recompute"]["recomputed_tokens"]
    tier = with_tier["cpu_tier"]
    assert tier["reloaded_tokens"] > 0 and tier["recomputed_tokens"] == with_tier["recompute"]["recomputed_tokens"]
    # c lost its 21 computed tokens: each came back from the GPU prefix cache, from the CPU tier, or was computed again
    assert tier["gpu_prefix_hit_tokens"] + tier["reloaded_tokens"] + tier["recomputed_tokens"] == 21
    # the GPU kept 3 of its 5 full blocks (as without a tier: a tier does not touch the GPU pool unless it loads)
    assert (tier["gpu_prefix_hit_tokens"], tier["reloaded_tokens"], tier["recomputed_tokens"]) == (12, 8, 1)
    assert without["recompute"]["recomputed_tokens"] == 9


def test_offloading_is_refused_without_v1_mechanics_or_prefix_caching():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        EngineConfig(vllm_engine="v1", kv_offloading_blocks=8)
    with pytest.raises(ValueError, match="vllm_engine v1"):
        EngineConfig(vllm_engine="v0", enable_prefix_caching=True, kv_offloading_blocks=8)
    with pytest.raises(ValueError, match="V1 mechanics"):
        unit_engine("fcfs", enable_prefix_caching=True, kv_offloading_blocks=8)


ENGINE = str(Path(sys.executable).with_name("engine"))
SESSIONS = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "sessions.json")


def _engine(*args: str, caching: str = "true") -> subprocess.CompletedProcess:
    return subprocess.run(
        [ENGINE, "run", "--policy", "vllm-v1", "--set", f"enable_prefix_caching={caching}", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_engine_run_with_a_cpu_tier_shows_its_hits_and_the_split_recompute_tax(tmp_path):
    proc = _engine(
        "--workload",
        SESSIONS,
        "-n",
        "20",
        "--set",
        "num_gpu_blocks=120",
        "--set",
        "kv_offloading_blocks=1000",
        "--set",
        "kv_offloading_policy=arc",
        "-o",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    for row in ("prefix hits (GPU / CPU tier)", "redone after preemption (reloaded / recomputed)", "(arc)"):
        assert row in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    tier = summary["cpu_tier"]
    assert tier["policy"] == "arc" and tier["blocks"] == 1000 and tier["prompt_only"] is True
    assert tier["cpu_prefix_hit_tokens"] > 0 and tier["reloaded_tokens"] > 0 and summary["preemptions"]["recompute"] > 0
    assert tier["recomputed_tokens"] == summary["recompute"]["recomputed_tokens"]
    assert summary["blocks_swapped_in"] == tier["loaded_blocks"] > 0 and summary["leaked_blocks"] == 0


@pytest.mark.parametrize(
    ("args", "caching", "says"),
    [
        (
            ["--set", "kv_offloading_blocks=-1"],
            "true",
            "kv_offloading_blocks: Input should be greater than or equal to 0",
        ),
        (
            ["--set", "kv_offloading_blocks=8", "--set", "kv_offloading_policy=fifo"],
            "true",
            "Input should be 'lru' or 'arc'",
        ),
        (["--set", "kv_offloading_blocks=8"], "false", "needs vllm_engine v1 and enable_prefix_caching"),
        (["--set", "kv_offloading_blocks=8", "--policy", "fcfs"], "true", "needs V1 mechanics"),
    ],
)
def test_bad_offloading_settings_get_one_line_and_exit_2(args, caching, says):
    proc = _engine("-n", "5", "-q", *args, caching=caching)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr
