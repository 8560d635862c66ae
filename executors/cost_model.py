"""Step-time model of the simulator: ``t = a + b·prefill_tokens + c·decode_seqs + d·kv_tokens_read
+ e·prefill_pairs``.

``prefill_pairs`` are the query-key pairs attention computes for the step's prefill chunks (a chunk of
c tokens after n of context: ``c·n + c(c+1)/2``), so a long prompt's prefill grows with its length
squared, as attention over the context does; ``StepFeatures`` counts them with the roofline's own walk
and formula (``executors/step_work.py``), and a profile without ``e`` (every file written before it)
charges none. Plus block movement: swaps cross PCIe at ``swap_gb_per_s``, copy-on-write copies move through
HBM at ``copy_gb_per_s``; each block is ``block_size × kv_bytes_per_token`` bytes. A profile may
also say what it models beyond time: the model's context length and the device memory its KV
cache gets, from which the simulator takes its defaults (``executors/settings.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvsched.core.outputs import SchedulerOutput
from kvsched.core.request import MAX_TOKENS

GIB = 1 << 30

# Bounds of a profile's numbers, checked as it loads (a profile file is input like any other): every one
# finite, and none so large (or a bandwidth so small) that a run's times could leave the floats. A step's
# time is then at most MAX_MS × (1 + its prefill tokens + its sequences + its KV tokens read + its pairs)
# plus its block moves at MIN_GB_PER_S; with every count below 2**63 (EngineConfig and Request bound them
# far lower) that is below 1e40 ms, and any run's sum of steps stays finite in float64 (summary.json, Parquet).
MAX_MS = 3.6e6  # one hour per step, per token or per sequence: no device comes near it
MAX_KV_BYTES_PER_TOKEN = 1 << 32  # 4 GiB per token, all layers (a 405B model in fp32 needs about 1 MiB)
MIN_GB_PER_S, MAX_GB_PER_S = 1e-6, 1e12  # a kilobyte per second to a zettabyte per second
MAX_GIB = float(1 << 20)  # a pebibyte of device memory

Ms = Annotated[float, Field(ge=0, le=MAX_MS, allow_inf_nan=False)]
GbPerS = Annotated[float, Field(ge=MIN_GB_PER_S, le=MAX_GB_PER_S, allow_inf_nan=False)]
Gib = Annotated[float, Field(ge=0, le=MAX_GIB, allow_inf_nan=False)]


class KvMemory(BaseModel):
    """A device's memory as vLLM's profiling run divides it: the KV cache gets what is left of
    ``gpu_memory_utilization`` × the device's memory once the weights and the activations are in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_gib: Gib = Field(gt=0, description="device memory, as the runtime reports it")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="the share vLLM may use (its default 0.9)")
    weights_gib: Gib = Field(description="the model's weights")
    activations_gib: Gib = Field(description="peak activations and non-torch memory of vLLM's profiling run")

    @model_validator(mode="after")
    def _room(self) -> KvMemory:
        if self.kv_cache_bytes <= 0:
            raise ValueError("the weights and activations leave no memory for the KV cache")
        return self

    @property
    def kv_cache_bytes(self) -> float:
        return (self.device_gib * self.gpu_memory_utilization - self.weights_gib - self.activations_gib) * GIB


class StepCost(Protocol):
    """What the simulator asks of a cost profile: a step's time, and what it models beyond time.

    ``CostProfile`` (below, the linear model) and ``RooflineProfile`` (``executors/roofline.py``,
    derived from a model config and a GPU) are the two kinds.
    """

    name: str
    max_model_len: int | None
    kv_bytes_per_token: int  # all layers and GPUs: what a swap or a KV transfer moves
    decode_exact: bool  # whether decode_seconds is exact for every decode step (else the decode lane is off)
    serving_seconds: tuple[float, float]  # the serving stack's time per request before and after the engine

    def step_seconds(self, out: SchedulerOutput, block_size: int) -> float: ...

    def seconds(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        kv_tokens_read: int,
        blocks_swapped: int,
        blocks_copied: int,
        block_size: int,
        prefill_pairs: int = 0,
    ) -> float: ...

    def decode_seconds(self, decode_seqs: int) -> Callable[[int], float]: ...

    def num_kv_blocks(self, block_size: int) -> int | None: ...


class CostProfile(BaseModel):
    """Coefficients of one (model, hardware) pair, in milliseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    base_ms: Ms = Field(description="a: per-step floor (weights read once per step)")
    prefill_token_ms: Ms = Field(description="b: per prefill (or chunk) token")
    decode_seq_ms: Ms = Field(description="c: per decoding sequence")
    kv_token_ms: Ms = Field(description="d: per KV token read by attention")
    attention_pair_ms: Ms = Field(
        0.0,
        description="e: per query-key pair a prefill chunk computes (chunk × "
        "context, causal inside the chunk); 0 in files written before it",
    )
    kv_bytes_per_token: int = Field(
        ge=0, le=MAX_KV_BYTES_PER_TOKEN, description="KV cache bytes of one token, all layers"
    )
    swap_gb_per_s: GbPerS = Field(description="effective GPU<->CPU copy bandwidth")
    copy_gb_per_s: GbPerS = Field(description="effective GPU<->GPU copy bandwidth")
    max_model_len: int | None = Field(None, ge=1, le=MAX_TOKENS, description="the model's context length, in tokens")
    kv_memory: KvMemory | None = Field(None, description="the device memory the KV cache gets")

    decode_exact: ClassVar[bool] = True  # a decode step's time depends on its total context only
    serving_seconds: ClassVar[tuple[float, float]] = (0.0, 0.0)  # it models the engine's steps alone

    def num_kv_blocks(self, block_size: int) -> int | None:
        """GPU blocks of ``block_size`` tokens in ``kv_memory``, as vLLM counts them (None: the profile does not
        say)."""
        if self.kv_memory is None or not self.kv_bytes_per_token:
            return None
        return int(self.kv_memory.kv_cache_bytes // (block_size * self.kv_bytes_per_token))

    def step_seconds(self, out: SchedulerOutput, block_size: int) -> float:
        p, d, k, swapped, copied, pairs = out.features
        return self.seconds(p, d, k, swapped, copied, block_size, pairs)

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
        """The model's time for a step with these features (``StepFeatures``). The pairs' term is added only
        where there are pairs, so a step without (every decode step) costs what it did before, to the bit."""
        if not (prefill_tokens or decode_seqs or blocks_swapped):
            return 0.0
        ms = self._batch_ms(prefill_tokens, decode_seqs) + self.kv_token_ms * kv_tokens_read
        if prefill_pairs:
            ms += self.attention_pair_ms * prefill_pairs
        block_bytes = block_size * self.kv_bytes_per_token
        ms += blocks_swapped * block_bytes / (self.swap_gb_per_s * 1e6)
        ms += blocks_copied * 2 * block_bytes / (self.copy_gb_per_s * 1e6)
        return ms / 1000.0

    def decode_seconds(self, decode_seqs: int) -> Callable[[int], float]:
        """``seconds(0, decode_seqs, K, 0, 0, ·)`` as a function of K, for the steps of a steady run: the
        same operations in the same order (adding the zero block-move terms changes no bit)."""
        if not decode_seqs:
            return lambda kv_tokens_read: 0.0
        batch_ms, kv_ms = self._batch_ms(0, decode_seqs), self.kv_token_ms
        return lambda kv_tokens_read: (batch_ms + kv_ms * kv_tokens_read) / 1000.0

    def _batch_ms(self, prefill_tokens: int, decode_seqs: int) -> float:
        return self.base_ms + self.prefill_token_ms * prefill_tokens + self.decode_seq_ms * decode_seqs


LLAMA2_7B_A100 = CostProfile(
    name="llama2-7b-a100",
    description=(
        "Llama-2-7B, one A100-80GB, fp16: fitted to Vidur's per-operator profiles (3.8% mean error over "
        "3,700 reference steps), prefill attention at Vidur's measured cost per query-key pair (chunks up to "
        "2,944 tokens after up to 3,840); swap at 12.6 GB/s (vLLM's batched swap kernel, PR #11531); "
        "4,096-token context, the KV cache what vLLM leaves of the A100's memory at gpu_memory_utilization 0.9"
    ),
    base_ms=9.01,
    prefill_token_ms=0.0623,
    decode_seq_ms=0.110,
    kv_token_ms=2.40e-4,
    attention_pair_ms=4.46e-6,
    kv_bytes_per_token=2 * 32 * 4096 * 2,  # K and V, 32 layers, 4096 wide, fp16: 512 KiB
    swap_gb_per_s=12.6,
    copy_gb_per_s=1500.0,
    max_model_len=4096,
    kv_memory=KvMemory(
        device_gib=79.15,  # what CUDA reports for an A100-80GB
        weights_gib=12.55,  # 6.74 B parameters in fp16
        activations_gib=1.5,  # an estimate of the profiling run's peak for a 4,096-token batch, with non-torch memory
    ),
)

SMOLLM2_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # K and V, 30 layers, 3 KV heads of 64, fp32: 45 KiB

SMOLLM2_135M_CPU = CostProfile(
    name="smollm2-135m-cpu",
    description=(
        "SmolLM2-135M-Instruct (fp32) on the transformers executor, one CPU thread of the project "
        "machine: fitted by benchmarks/real_throughput.py to 328 measured steps of a batch-64 run and "
        "a staggered small-batch run (mean error 7.9%; predicted a held-out workload's mean TTFT and "
        "TPOT within 0.1%, and a repeat run's fit within 1.4% and 7.0%); block moves at an assumed 5 GB/s"
    ),
    base_ms=76.1,
    prefill_token_ms=2.56,
    decode_seq_ms=3.264,
    kv_token_ms=0.01137,
    kv_bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN,
    swap_gb_per_s=5.0,
    copy_gb_per_s=5.0,
    max_model_len=8192,  # the GGUF file's llama.context_length; the KV cache is what the executor is given
)

SMOLLM2_135M_VLLM_CPU = CostProfile(
    name="smollm2-135m-vllm-cpu",
    description=(
        "SmolLM2-135M-Instruct (fp32) served by real vLLM 0.32 (vllm-cpu, its own V1 scheduler) on one CPU thread "
        "of the project machine: fitted by benchmarks/fidelity_vllm.py to 395 measured steps (mean error 3.2%); "
        "with vllm-v1 it predicted two held-out workloads' mean TTFT, TPOT and E2E within 6.1% (docs/simulation.md). "
        "vLLM has no CPU swap: the block-move rates are placeholders it never uses"
    ),
    base_ms=22.12,
    prefill_token_ms=0.9966,
    decode_seq_ms=1.269,
    kv_token_ms=0.003495,
    kv_bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN,
    swap_gb_per_s=16.0,
    copy_gb_per_s=100.0,
)

PROFILES: dict[str, CostProfile] = {p.name: p for p in (LLAMA2_7B_A100, SMOLLM2_135M_CPU, SMOLLM2_135M_VLLM_CPU)}
DEFAULT_PROFILE = LLAMA2_7B_A100.name
