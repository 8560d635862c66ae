"""P/D disaggregation's two costs: moving a prompt's KV from a prefill replica to a decode replica,
and the decode replica not computing what it received.

The transfer takes ``base_latency_s + prompt_tokens × kv_bytes_per_token / bandwidth`` (BLIS's
model: a fixed set-up plus bytes over bandwidth; the bytes per token come from the prefill
replica's cost profile). On the decode replica the request arrives as a prompt whose KV is
already there: ``DecodeExecutor`` allocates its blocks like any admission but charges no prefill
compute for them, only for prompts it recomputes after a preemption.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvsched.core.executor import StepResult
from kvsched.core.outputs import SchedulerOutput, causal_pairs
from kvsched.executors.cost_model import DEFAULT_PROFILE, StepCost
from kvsched.executors.simulated import SimulatedExecutor, charged


class KvTransfer(BaseModel):
    """What moving one request's KV costs: ``base_latency_s + bytes / (bandwidth_gb_per_s × 1e9)``.

    Bounded so that every transfer takes a finite time a run can add up: at least a kilobyte a
    second, at most an hour of set-up (a bandwidth of 1e-320 GB/s once made every transfer take
    forever, so no request reached the decode pool)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    bandwidth_gb_per_s: float = Field(
        25.0, ge=1e-6, description="effective transfer bandwidth (25 GB/s: a 200 Gb/s RDMA link, as NIXL uses)"
    )
    base_latency_s: float = Field(0.0005, ge=0, le=3600, description="fixed cost of one transfer (set-up, handshake)")

    def seconds(self, prompt_tokens: int, kv_bytes_per_token: int) -> float:
        return self.base_latency_s + prompt_tokens * kv_bytes_per_token / (self.bandwidth_gb_per_s * 1e9)


class DecodeExecutor(SimulatedExecutor):
    """The simulator on a decode replica: a received prompt's KV is loaded, not computed.

    What it received is the original prompt's positions (all but the handed-over prompt's last token,
    the first token, which it computes itself) that its prefill steps ran before any preemption by
    recompute; ``received`` keeps the count per request (by its group's index) until the fleet's
    records take it: the tokens a request's decode half counts as computed but did not compute."""

    def __init__(self, profile: str | StepCost = DEFAULT_PROFILE, block_size: int | None = None) -> None:
        super().__init__(profile, block_size)
        self.received: dict[int, int] = {}

    def execute(self, output: SchedulerOutput) -> StepResult:
        result = super().execute(output)
        received = received_pairs = 0
        tally = self.received
        for sg in output.scheduled[output.lane_decodes :]:
            group = sg.group
            if sg.is_prefill and not group.num_recompute_preemptions:
                start = group.seqs[0].num_computed_tokens
                loaded = max(0, min(sg.num_tokens, group.request.prompt_len - 1 - start))
                if loaded:
                    tally[group.index] = tally.get(group.index, 0) + loaded
                    received += loaded
                    received_pairs += causal_pairs(start, loaded)
        if not received:
            return result
        p, d, k, swapped, copied, pairs = output.features
        seconds = self.profile.seconds(p - received, d, k, swapped, copied, self.block_size, pairs - received_pairs)
        return StepResult(charged(seconds), result.tokens)
