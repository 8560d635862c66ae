"""Step-time model of the simulator: ``t = a + b·prefill_tokens + c·decode_seqs + d·kv_tokens_read``.

Plus block movement: swaps cross PCIe at ``swap_gb_per_s``, copy-on-write copies move through
HBM at ``copy_gb_per_s``; each block is ``block_size × kv_bytes_per_token`` bytes.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvsched.core.outputs import SchedulerOutput


class CostProfile(BaseModel):
    """Coefficients of one (model, hardware) pair, in milliseconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    base_ms: float = Field(ge=0, description="a: per-step floor (weights read once per step)")
    prefill_token_ms: float = Field(ge=0, description="b: per prefill (or chunk) token")
    decode_seq_ms: float = Field(ge=0, description="c: per decoding sequence")
    kv_token_ms: float = Field(ge=0, description="d: per KV token read by attention")
    kv_bytes_per_token: int = Field(ge=0, description="KV cache bytes of one token, all layers")
    swap_gb_per_s: float = Field(gt=0, description="effective GPU<->CPU copy bandwidth")
    copy_gb_per_s: float = Field(gt=0, description="effective GPU<->GPU copy bandwidth")

    def step_seconds(self, out: SchedulerOutput, block_size: int) -> float:
        f = out.features
        if not (f.prefill_tokens or f.decode_seqs or f.blocks_swapped):
            return 0.0
        ms = self.base_ms + self.prefill_token_ms * f.prefill_tokens + self.decode_seq_ms * f.decode_seqs + self.kv_token_ms * f.kv_tokens_read
        block_bytes = block_size * self.kv_bytes_per_token
        ms += f.blocks_swapped * block_bytes / (self.swap_gb_per_s * 1e6)
        ms += f.blocks_copied * 2 * block_bytes / (self.copy_gb_per_s * 1e6)
        return ms / 1000.0


LLAMA2_7B_A100 = CostProfile(
    name="llama2-7b-a100",
    description=(
        "Llama-2-7B, one A100-80GB, fp16: a 4-term fit (3.2% mean error) to Vidur's per-operator "
        "profiles; swap at 12.6 GB/s (vLLM's batched swap kernel, PR #11531)"
    ),
    base_ms=9.06,
    prefill_token_ms=0.0666,
    decode_seq_ms=0.0882,
    kv_token_ms=2.54e-4,
    kv_bytes_per_token=2 * 32 * 4096 * 2,  # K and V, 32 layers, 4096 wide, fp16: 512 KiB
    swap_gb_per_s=12.6,
    copy_gb_per_s=1500.0,
)

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
    kv_bytes_per_token=2 * 30 * 3 * 64 * 4,  # K and V, 30 layers, 3 KV heads of 64, fp32: 45 KiB
    swap_gb_per_s=5.0,
    copy_gb_per_s=5.0,
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
    kv_bytes_per_token=2 * 30 * 3 * 64 * 4,  # K and V, 30 layers, 3 KV heads of 64, fp32: 45 KiB
    swap_gb_per_s=16.0,
    copy_gb_per_s=100.0,
)

PROFILES: dict[str, CostProfile] = {p.name: p for p in (LLAMA2_7B_A100, SMOLLM2_135M_CPU, SMOLLM2_135M_VLLM_CPU)}
DEFAULT_PROFILE = LLAMA2_7B_A100.name
