"""The engine's knobs (the seed's tuning table), validated once at the edge."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvsched.core.request import MAX_TOKENS

# A block costs the pools about a hundred bytes: a bound keeping a typo (1e9 blocks) a clear error, not a MemoryError.
MAX_BLOCKS = 1 << 22


class PreemptionMode(str, Enum):
    SWAP = "swap"
    RECOMPUTE = "recompute"


class EngineConfig(BaseModel):
    """Scheduler and KV-cache settings, named as in vLLM's ``SchedulerConfig``/``CacheConfig``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    block_size: int = Field(16, ge=1, le=MAX_TOKENS, description="tokens per KV block")
    num_gpu_blocks: int = Field(2048, ge=1, le=MAX_BLOCKS, description="KV blocks in the GPU pool")
    num_cpu_blocks: int = Field(1024, ge=0, le=MAX_BLOCKS, description="KV blocks in the CPU swap pool")
    watermark: float = Field(0.01, ge=0.0, lt=1.0, description="share of GPU blocks kept free at admission")
    enable_prefix_caching: bool = Field(False, description="reuse full blocks with the same token prefix")
    max_num_batched_tokens: int = Field(2048, ge=1, le=MAX_TOKENS, description="token budget of one step")
    max_num_seqs: int = Field(256, ge=1, le=MAX_TOKENS, description="running sequences at most")
    max_model_len: int | None = Field(None, ge=1, le=MAX_TOKENS, description="longest sequence; unset: the step budget")
    delay_factor: float = Field(0.0, ge=0.0, description="prefill delay gate, in units of the last prompt latency")
    preemption_mode: PreemptionMode | None = Field(None, description="swap or recompute every victim (unset: vLLM's)")
    audit_every_step: bool = Field(False, description="check every allocator invariant after each step")
    vllm_engine: Literal["v0", "v1"] = Field("v0", description="whose mechanics the core follows (docs/vllm-v1.md)")
    decode_lane: bool = Field(True, description="the simulator advances plain decodes together (same results)")
    enable_chunked_prefill: bool = Field(True, description="V1's knob, read by vllm-v1: off, a prompt runs whole")
    async_scheduling: bool = Field(False, description="vLLM's AsyncScheduler: outputs seen a step late (async_lag.py)")
    # The scheduler's CPU time per step, and per request it runs. Unset: V1's with async_scheduling, else 0.
    scheduler_ms: float | None = Field(None, ge=0, le=3.6e6, description="scheduler time per step")
    scheduler_request_ms: float | None = Field(None, ge=0, le=3.6e6, description="scheduler time per request run")
    num_speculative_tokens: int = Field(0, ge=0, le=64, description="V1's draft tokens per decode (v0 ignores it)")
    kv_offloading_blocks: int = Field(0, ge=0, le=MAX_BLOCKS, description="a CPU tier behind V1's prefix cache")
    kv_offloading_policy: Literal["lru", "arc"] = Field("lru", description="how the CPU tier evicts: vLLM's lru or arc")
    offload_prompt_only: bool = Field(True, description="the CPU tier stores prompt blocks only (vLLM's default)")

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.vllm_engine == "v1" and self.num_gpu_blocks < 2:
            raise ValueError("vllm_engine v1 needs num_gpu_blocks >= 2: V1 keeps one block as its null block")
        if (
            self.vllm_engine == "v1"
            and not self.enable_chunked_prefill
            and self.max_num_batched_tokens < self.model_len
        ):
            raise ValueError(  # vLLM's SchedulerConfig.verify_max_model_len
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.model_len}) with chunked prefill off: no longer prompt could ever be scheduled"
            )
        if self.kv_offloading_blocks and (
            self.vllm_engine != "v1" and "vllm_engine" in self.model_fields_set or not self.enable_prefix_caching
        ):
            raise ValueError(
                "kv_offloading_blocks needs vllm_engine v1 and enable_prefix_caching: the CPU tier keeps "
                "blocks by their prefix hashes, behind V1's prefix cache"
            )
        if self.max_num_seqs > self.max_num_batched_tokens:
            raise ValueError(
                f"max_num_seqs ({self.max_num_seqs}) exceeds max_num_batched_tokens "
                f"({self.max_num_batched_tokens}): a full decode step could never fit the token budget"
            )
        return self

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.max_num_batched_tokens

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_gpu_blocks)
