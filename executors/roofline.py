"""The step time of a model on a GPU, derived from its config and the GPU's datasheet (a roofline).

A vLLM step on a GPU (per GPU of a tensor-parallel group of ``tp``) costs the sum of:

- **weight GEMMs**: every weight read once per step, and 2 FLOPs per weight per token; each part
  takes the longer of its compute (FLOPs ÷ achieved FLOP/s) and its reads (bytes ÷ achieved
  bandwidth): the roofline, whose crossover is where a step's tokens make it compute-bound. The
  dense part (attention projections, dense MLPs, shared experts, routers), the experts (an MoE
  layer reads the experts the step's tokens activate, ``E·(1 − (1 − k/E)^T)`` of E for T tokens
  routed top-k uniformly, and computes k of them per token) and the LM head (one row per request
  in the step) are each rooflined on their own. FP8 weights are read at one byte and computed on
  fp8 tensor cores where the GPU has them.
- **attention**: prefill chunks compute their query-key pairs (``executors/step_work.py``: a chunk
  after a context, GQA/MQA head counts, sliding windows where the config has them) and read their
  KV; decodes read their context's KV (memory-bound).
- **tensor parallelism**: two all-reduces per layer, each a latency per GPU it waits on (``tp − 1``
  of them) plus a ring's ``2(tp−1)/tp`` of the step's activations over the GPU link.
- **overheads**: per step, per layer (launches outside CUDA graphs) and per request in the step.

The shares of peak achieved and the overheads are ``Efficiency`` (``executors/hardware.py``),
fitted to real runs. The KV cache gets what vLLM leaves of the device memory
(``gpu_memory_utilization`` × memory − weights − activations), divided by the per-GPU KV bytes of
a token. ``RooflineProfile`` answers what the simulator asks of any cost profile (``StepCost``), so
it is one more way to get a profile, not a second simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from kvsched.core.outputs import SchedulerOutput, causal_pairs
from kvsched.executors.cost_model import GIB, KvMemory
from kvsched.executors.hardware import Efficiency, Hardware
from kvsched.executors.model_config import BYTES, ModelShape
from kvsched.executors.step_work import AttentionWork, attention_work

RUNTIME_GIB = 1.5  # vLLM's memory outside weights and the profiled activations: CUDA context, NCCL, CUDA graphs


class RooflineProfile(BaseModel):
    """A cost profile derived from a model shape, a GPU and a tensor-parallel degree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    model: ModelShape
    hardware: Hardware
    tp: int = Field(1, ge=1, le=1024)
    dtype: Literal["bf16", "fp16", "fp8", "fp32"] = Field(
        "bf16", description="the weights' dtype (fp8: one byte a weight)"
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_num_batched_tokens: int = Field(2048, ge=1, description="the step budget vLLM profiles activations with")
    max_model_len: int | None = Field(
        None, ge=1, description="the longest sequence (unset: the model's context length)"
    )
    _c: dict[str, float] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _derive(self) -> RooflineProfile:
        self.model.check_tp(self.tp, self.model.name)
        if self.max_model_len is None:
            object.__setattr__(self, "max_model_len", self.model.max_position_embeddings)  # vLLM's default
        self._c.update(self._constants())
        if self.kv_memory.kv_cache_bytes <= 0:
            raise ValueError(
                f"{self.model.name} at {self.dtype} leaves no memory for the KV cache on {self.tp} "
                f"{self.hardware.name} (weights {self.kv_memory.weights_gib:.1f} GiB per GPU)"
            )
        return self

    # ----------------------------------------------------------------- what the simulator asks
    @property
    def decode_exact(self) -> bool:
        """Whether ``decode_seconds`` is exact: not with a sliding window, whose reads depend on each context."""
        return self.model.sliding_window is None

    @property
    def serving_seconds(self) -> tuple[float, float]:
        """The serving stack's time per request outside the engine: before its first token, after its last."""
        e = self.hardware.efficiency
        return e.api_ms / 1000.0, e.response_ms / 1000.0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token, all layers and all GPUs (what a swap or a transfer moves)."""
        return int(self._c["kv_token_layer"] * self.model.num_layers * self.tp)

    @property
    def kv_memory(self) -> KvMemory:
        """The device memory vLLM's profiling run leaves for the KV cache, per GPU."""
        c = self._c
        return KvMemory.model_construct(
            device_gib=self.hardware.memory_gib,
            gpu_memory_utilization=self.gpu_memory_utilization,
            weights_gib=c["weight_bytes"] / GIB,
            activations_gib=c["activation_bytes"] / GIB,
        )

    def num_kv_blocks(self, block_size: int) -> int:
        """GPU blocks of ``block_size`` tokens, as vLLM counts them (each GPU holds its share of every block)."""
        return int(self.kv_memory.kv_cache_bytes // (block_size * self._c["kv_token_layer"] * self.model.num_layers))

    def step_shape(self, out: SchedulerOutput) -> StepShape:
        """What the step's time depends on (before the engine applies it)."""
        full = attention_work(out)
        window = self.model.sliding_window
        return StepShape(
            out.prefill_tokens + out.decode_seqs,
            len(out.scheduled),
            full,
            attention_work(out, window) if window else full,
        )

    def step_seconds(self, out: SchedulerOutput, block_size: int) -> float:
        if not (out.prefill_tokens or out.decode_seqs or out.blocks_to_swap_in or out.blocks_to_swap_out):
            return 0.0
        seconds = step_time(self.sizes, self.hardware.efficiency, *self.step_shape(out))
        swapped = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        return (
            seconds + self._moves(swapped, len(out.blocks_to_copy), block_size)
            if (swapped or out.blocks_to_copy)
            else seconds
        )

    def seconds(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_tokens_read: int,
        blocks_swapped: int,
        blocks_copied: int,
        block_size: int,
        prefill_pairs: int = 0,
    ) -> float:
        """A step known only by its totals (``StepFeatures``): the prefill's pairs as counted (none counted: the
        prefill taken as one chunk without context), reading its own tokens."""
        if not (prefill_tokens or decode_seqs or blocks_swapped):
            return 0.0
        work = AttentionWork(
            prefill_pairs or causal_pairs(0, prefill_tokens), prefill_tokens, kv_tokens_read + decode_seqs
        )
        requests = decode_seqs + (1 if prefill_tokens else 0)
        return step_time(
            self.sizes, self.hardware.efficiency, prefill_tokens + decode_seqs, requests, work, work
        ) + self._moves(blocks_swapped, blocks_copied, block_size)

    def decode_seconds(self, decode_seqs: int) -> Callable[[int], float]:
        """``step_seconds`` of a step of ``decode_seqs`` one-token decodes, by the context tokens they read."""
        if not decode_seqs:
            return lambda kv_tokens_read: 0.0
        sizes, e = self.sizes, self.hardware.efficiency
        return lambda kv_tokens_read: step_time(
            sizes, e, decode_seqs, decode_seqs, *_decodes(kv_tokens_read + decode_seqs)
        )

    def _moves(self, swapped: int, copied: int, block_size: int) -> float:
        """Block moves, each GPU moving its share: swaps over PCIe, copy-on-write copies through HBM (read, write)."""
        c = self.sizes
        block = block_size * c["kv_token_layer"] * self.model.num_layers
        return swapped * block / (self.hardware.pcie_gb_s * 1e9) + copied * 2 * block / (
            c["hbm"] * self.hardware.efficiency.bandwidth_share
        )

    @property
    def sizes(self) -> dict[str, float]:
        """Per-GPU sizes and peaks the step time needs (computed once)."""
        return self._c

    def _constants(self) -> dict[str, float]:
        m, hw, tp = self.model, self.hardware, self.tp
        weight, act = BYTES[self.dtype], 4 if self.dtype == "fp32" else 2
        h, layers = m.hidden_size, m.num_layers
        kv_heads = max(1, m.num_kv_heads // tp)  # vLLM replicates KV heads over a group larger than their number
        projections = h * m.num_heads * m.head_dim * 2 // tp + 2 * h * kv_heads * m.head_dim
        dense = layers * projections + m.dense_layers * 3 * h * m.intermediate_size // tp
        dense += m.moe_layers * (3 * h * m.shared_expert_intermediate_size // tp + h * m.num_experts)
        expert = 3 * h * m.expert_intermediate_size // tp  # one expert of one layer, this GPU's share
        lm = m.vocab_size * h // tp
        c = {
            "gemm_peak": hw.peak_flops(self.dtype),
            "bf16_peak": hw.peak_flops("bf16"),  # the LM head stays in 16 bits
            "hbm": hw.bandwidth_tb_s * 1e12,
            "link": hw.link_gb_s * 1e9,
            "tp": float(tp),
            "layers": float(layers),
            "dense_flops": 2.0 * dense,
            "dense_bytes": float(dense * weight),
            "experts": float(m.num_experts if m.moe_layers else 0),
            "miss": 1.0 - m.experts_per_token / m.num_experts if m.num_experts else 1.0,
            "expert_flops": 2.0 * m.moe_layers * m.experts_per_token * expert,
            "expert_bytes": float(m.moe_layers * expert * weight),
            "lm_flops": 2.0 * lm,
            "lm_bytes": float(lm * act),
            "kv_token_layer": float(2 * kv_heads * m.head_dim * act),
            "pair_flops": 4.0 * (m.num_heads // tp) * m.head_dim,
            "full_layers": float(layers - m.window_layers),
            "window_layers": float(m.window_layers),
            "allreduces": 2.0 * layers if tp > 1 else 0.0,
            "allreduce_bytes": 2.0 * (tp - 1) / tp * h * act,
            "hops": float(tp - 1),  # an all-reduce's fixed latency grows with the GPUs it waits on
        }
        embeddings = m.vocab_size * h // tp * act * (1 if m.tie_word_embeddings else 2)
        c["weight_bytes"] = float((dense + m.num_experts * m.moe_layers * expert) * weight + embeddings)
        # The profiling run's peak: one step of max_num_batched_tokens through the widest MLP, and the logits.
        widest = max(m.intermediate_size, m.expert_intermediate_size * max(1, m.experts_per_token)) // tp
        c["activation_bytes"] = float(self.max_num_batched_tokens * (2 * widest + 4 * h) * act + RUNTIME_GIB * GIB)
        return c


class StepShape(NamedTuple):
    """What a step's time depends on: its tokens, its requests, and its attention (all layers' and windowed layers')."""

    tokens: int
    requests: int
    full: AttentionWork
    windowed: AttentionWork


def step_time(
    c: dict[str, float], e: Efficiency, tokens, requests, full: AttentionWork, windowed: AttentionWork, maximum=max
):
    """A step's seconds on one GPU: the module's sum, from the sizes ``c`` (``RooflineProfile.sizes``) and the
    efficiencies ``e``. Scalars, or with ``maximum=numpy.maximum`` arrays of many steps at once (the fit's)."""
    flops, bandwidth = c["gemm_peak"] * e.flops_share, c["hbm"] * e.bandwidth_share
    t = maximum(tokens * (c["dense_flops"] / flops), c["dense_bytes"] / bandwidth)
    if c["experts"]:
        touched = c["experts"] * (1.0 - c["miss"] ** tokens)
        t = t + maximum(tokens * (c["expert_flops"] / flops), touched * (c["expert_bytes"] / bandwidth))
    t = t + maximum(requests * (c["lm_flops"] / (c["bf16_peak"] * e.flops_share)), c["lm_bytes"] / bandwidth)
    pair_s, kv_s = c["pair_flops"] / (c["bf16_peak"] * e.attention_flops_share), c["kv_token_layer"] / bandwidth
    for layers, work in ((c["full_layers"], full), (c["window_layers"], windowed)):
        if layers:
            t = t + layers * (maximum(work.prefill_pairs * pair_s, work.prefill_kv * kv_s) + work.decode_kv * kv_s)
    if c["allreduces"]:
        latency = c["hops"] * e.allreduce_us * 1e-6
        t = t + c["allreduces"] * (latency + tokens * (c["allreduce_bytes"] / (c["link"] * e.bandwidth_share)))
    return t + (e.step_ms * 1e-3 + c["layers"] * e.layer_us * 1e-6) + requests * (e.request_us * 1e-6)


def _decodes(kv_tokens: int) -> tuple[AttentionWork, AttentionWork]:
    work = AttentionWork(0, 0, kv_tokens)
    return work, work
