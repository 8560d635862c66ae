"""Hypothesis strategies for engine configs, requests and overload scenarios, sized to put a policy under pressure.

Configs are small (a few dozen blocks) so that admission waits, decodes preempt, multi-sequence
groups swap, and some prompts can never fit; requests draw prompts from a few shared prefixes so
that prefix caching has something to find.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from kvsched.core.config import EngineConfig, PreemptionMode
from kvsched.core.request import Request, SamplingParams

SHARED_PREFIXES = (tuple(range(1000, 1064)), tuple(range(2000, 2032)), ())
TENANTS = ("vip", "alice", "bob")


@st.composite
def engine_configs(draw) -> EngineConfig:
    """Small, tight configs: every knob of the seed's tuning table, including the awkward corners."""
    block_size = draw(st.sampled_from((1, 4, 16)))
    max_tokens = draw(st.sampled_from((64, 128, 256, 512)))
    return EngineConfig(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(4, 96 if block_size > 1 else 400)),
        num_cpu_blocks=draw(st.sampled_from((0, 8, 64))),
        watermark=draw(st.sampled_from((0.0, 0.01, 0.1))),
        enable_prefix_caching=draw(st.booleans()),
        max_num_batched_tokens=max_tokens,
        max_num_seqs=draw(st.integers(1, min(max_tokens, 16))),
        max_model_len=draw(st.sampled_from((None, 256, 1024))),
        delay_factor=draw(st.sampled_from((0.0, 0.0, 0.5, 2.0))),
        preemption_mode=draw(st.sampled_from((None, None, PreemptionMode.SWAP, PreemptionMode.RECOMPUTE))),
    )


@dataclass(frozen=True)
class RequestSpec:
    """A request without id or arrival time (the machine stamps both when it submits it)."""

    prefix: int
    suffix_len: int
    output_len: int
    n: int
    priority: int
    tenant: str

    def build(self, request_id: str, arrival_time: float, salt: int) -> Request:
        suffix = tuple(range(salt * 10_000, salt * 10_000 + self.suffix_len))
        return Request(
            request_id=request_id,
            prompt_token_ids=SHARED_PREFIXES[self.prefix] + suffix,
            arrival_time=arrival_time,
            priority=self.priority,
            tenant=self.tenant,
            output_len=self.output_len,
            sampling=SamplingParams(n=self.n, max_tokens=self.output_len + 4),
        )


def request_specs() -> st.SearchStrategy[RequestSpec]:
    return st.builds(
        RequestSpec,
        prefix=st.integers(0, len(SHARED_PREFIXES) - 1),
        suffix_len=st.one_of(st.integers(1, 48), st.integers(49, 700)),
        output_len=st.integers(1, 24),
        n=st.sampled_from((1, 1, 1, 2, 3)),
        priority=st.integers(0, 3),
        tenant=st.sampled_from(TENANTS),
    )


@dataclass(frozen=True)
class OverloadScenario:
    """Victim requests (one per ordinary tenant), then a continuous stream of more favoured requests.

    The stream arrives faster than the engine serves it and is favoured by every rule a policy
    might order by: more urgent priority, the VIP tenant, shorter prompts and outputs. The
    victims arrive once the backlog exists, and must finish before the stream ends.
    """

    seed: int
    victim_priority: int
    victim_prompt: int
    victim_output: int
    overload: float
    victim_arrival_s: float = 2.0
    horizon_s: float = 60.0

    def requests(self) -> list[Request]:
        import random

        rng = random.Random(self.seed)
        out = [
            Request(
                request_id=f"victim-{tenant}",
                prompt_len=self.victim_prompt,
                arrival_time=self.victim_arrival_s,
                priority=self.victim_priority,
                tenant=tenant,
                output_len=self.victim_output,
                sampling=SamplingParams(max_tokens=self.victim_output),
            )
            for tenant in VICTIM_TENANTS
        ]
        rate = OVERLOAD_BASE_RATE * self.overload
        t, i = 0.0, 0
        while t < self.horizon_s:
            out.append(
                Request(
                    request_id=f"stream-{i}",
                    prompt_len=rng.randint(32, 64),
                    arrival_time=round(t, 6),
                    priority=0,
                    tenant="vip",
                    output_len=(o := rng.randint(4, 12)),
                    sampling=SamplingParams(max_tokens=o),
                )
            )
            t += rng.expovariate(rate)
            i += 1
        return sorted(out, key=lambda r: r.arrival_time)


VICTIM_TENANTS = tuple(t for t in TENANTS if t != "vip")
OVERLOAD_PROFILE = "llama2-7b-a100"  # pinned: the base rate below was measured with it
OVERLOAD_BASE_RATE = 70.0  # requests/s the overload config serves about (measured with fcfs)
OVERLOAD_CONFIG = EngineConfig(num_gpu_blocks=48, num_cpu_blocks=32, max_num_batched_tokens=512, max_num_seqs=32)


def overload_scenarios() -> st.SearchStrategy[OverloadScenario]:
    return st.builds(
        OverloadScenario,
        seed=st.integers(0, 2**16),
        victim_priority=st.integers(1, 3),
        victim_prompt=st.integers(64, 160),
        victim_output=st.integers(40, 96),
        overload=st.floats(1.6, 2.0),
    )
