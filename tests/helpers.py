"""Small builders shared by the core tests (not a test module: no test_ prefix)."""

from __future__ import annotations

from kvsched.core.hookspecs import hookimpl
from kvsched.core.request import BlockPrompt, Request, SamplingParams
from kvsched.core.sequence import SequenceGroup
from kvsched.policies.vllm_default import VllmDefault

_counter = iter(range(10**9))


def make_group(
    tokens, n: int = 1, max_tokens: int = 64, arrival: float = 0.0, request_id: str | None = None
) -> SequenceGroup:
    """A bare SequenceGroup (no engine) with sequence ids unique across the test session."""
    index = next(_counter)
    request = Request(
        request_id=request_id or f"g{index}",
        prompt_token_ids=tokens if isinstance(tokens, BlockPrompt) else tuple(tokens),
        sampling=SamplingParams(n=n, max_tokens=max_tokens),
        arrival_time=arrival,
    )
    return SequenceGroup(request, index, first_seq_id=index * 1000)


def req(
    rid: str, prompt_len: int, output_len: int, arrival: float = 0.0, n: int = 1, max_tokens: int | None = None, **kw
) -> Request:
    """A simulation request: prompt given by length, true output length known."""
    return Request(
        request_id=rid,
        prompt_len=prompt_len,
        output_len=output_len,
        arrival_time=arrival,
        sampling=SamplingParams(n=n, max_tokens=max_tokens or output_len),
        **kw,
    )


def engine_configs(**fields):
    """A Hypothesis strategy for EngineConfig keyword dicts: small pools and budgets that force
    preemption, swapping and ignoring; ``fields`` adds or replaces strategies."""
    from hypothesis import strategies as st

    common = dict(
        block_size=st.sampled_from([1, 2, 4, 16]),
        num_gpu_blocks=st.integers(8, 96),
        num_cpu_blocks=st.integers(0, 48),
        watermark=st.sampled_from([0.0, 0.01, 0.1]),
        max_num_batched_tokens=st.sampled_from([64, 128, 512]),
        max_num_seqs=st.integers(1, 32),
        preemption_mode=st.sampled_from([None, "swap", "recompute"]),
    )
    return st.builds(dict, **{**common, **fields})


def unit_engine(policy="vllm-default", **config):
    """An engine whose every non-empty step takes exactly one simulated second."""
    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.executors.cost_model import CostProfile
    from kvsched.executors.simulated import SimulatedExecutor

    unit = CostProfile(
        name="unit",
        base_ms=1000,
        prefill_token_ms=0,
        decode_seq_ms=0,
        kv_token_ms=0,
        kv_bytes_per_token=0,
        swap_gb_per_s=1,
        copy_gb_per_s=1,
    )
    cfg = EngineConfig(
        **{
            "block_size": 4,
            "num_gpu_blocks": 64,
            "num_cpu_blocks": 64,
            "watermark": 0.0,
            "max_num_batched_tokens": 256,
            "max_num_seqs": 64,
            "audit_every_step": True,
            **config,
        }
    )
    return Engine(cfg, policy, SimulatedExecutor(unit))


def ids(groups) -> list[str]:
    return [getattr(g, "request_id", None) or g.group.request_id for g in groups]


class CountingPolicy(VllmDefault):
    """vllm-default, counting the calls of its select_batch (a steady step repeated is not a call)."""

    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @hookimpl
    def select_batch(self, step):
        self.calls += 1
        return super().select_batch(step)
