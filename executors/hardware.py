"""A GPU as the roofline cost model sees it: datasheet peaks, and the shares of them vLLM achieves.

The datasheet part (``Hardware``) is what a vendor publishes: dense tensor-core FLOP/s per dtype,
memory bandwidth and size, interconnect bandwidth. The part no datasheet gives (``Efficiency``)
is fitted to real runs (``benchmarks/calibrate_gpu.py``, ``engine calibrate --from``): the
achieved FLOP and bandwidth shares, the per-step, per-layer and per-request overheads, the latency
of a tensor-parallel all-reduce, and the serving stack's own time per request outside the
engine (HTTP, tokenisation, detokenisation). Built-in GPUs are JSON files in
``executors/data/hardware/``; a user's is any such file (``--hardware my-gpu.json``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvsched.userfiles.reader import FileError, read_json


class HardwareError(FileError):
    """An unknown GPU name, or a hardware file that does not describe one."""


class Efficiency(BaseModel):
    """What vLLM achieves on a GPU beyond its datasheet, in the units named. The defaults are the values
    ``benchmarks/calibrate_gpu.py`` fitted to the BLIS team's 12 public H100-SXM runs not in overload
    (docs/fidelity.md), rounded to four digits; a GPU without its own fit takes them."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    flops_share: float = Field(
        0.7646, gt=0, le=1, description="achieved share of peak tensor FLOP/s in the weight GEMMs"
    )
    attention_flops_share: float = Field(
        0.4049, gt=0, le=1, description="achieved share of peak bf16 FLOP/s in prefill attention"
    )
    bandwidth_share: float = Field(0.8662, gt=0, le=1, description="achieved share of memory and link bandwidth")
    allreduce_us: float = Field(
        7.655,
        ge=0,
        le=1e6,
        description="latency of one tensor-parallel all-reduce per GPU beyond "
        "the first (tp − 1 of them: what each waits on)",
    )
    step_ms: float = Field(0.8743, ge=0, le=1e6, description="per step: scheduling, input preparation, sampling")
    layer_us: float = Field(8.482, ge=0, le=1e6, description="per layer and step: kernel launches outside CUDA graphs")
    request_us: float = Field(
        9.218, ge=0, le=1e6, description="per request in a step: its inputs and outputs on the CPU"
    )
    api_ms: float = Field(
        8.214,
        ge=0,
        le=1e6,
        description="per request, outside the engine: HTTP, tokenising, the first "
        "chunk's way back (added to TTFT and end-to-end latency, not to a step)",
    )
    response_ms: float = Field(
        2.009,
        ge=0,
        le=1e6,
        description="per request, after its last token: detokenising and "
        "closing the stream (added to end-to-end latency)",
    )
    fitted_on: str = Field(
        "12 public H100-SXM vLLM runs of Llama-2-7B TP1, Llama-2-70B TP4, Mixtral-8x7B TP2 and "
        "CodeLlama-34B TP2 (benchmarks/data/blis-h100)",
        description="the runs these values were fitted to (empty: priors, not fitted)",
    )


class Hardware(BaseModel):
    """One GPU model from its datasheet (dense, not sparse, tensor-core peaks)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(min_length=1)
    description: str = ""
    memory_gib: float = Field(gt=0, le=1 << 20, description="device memory as CUDA reports it")
    bandwidth_tb_s: float = Field(gt=0, le=1e4, description="memory bandwidth")
    bf16_tflops: float = Field(gt=0, le=1e7, description="dense bf16/fp16 tensor-core peak")
    fp8_tflops: float = Field(
        0.0,
        ge=0,
        le=1e7,
        description="dense fp8 tensor-core peak (0: no fp8 tensor cores; "
        "fp8 weights are then computed in bf16, only read at one byte)",
    )
    link_gb_s: float = Field(gt=0, le=1e6, description="GPU-to-GPU bandwidth per direction (NVLink, else PCIe)")
    pcie_gb_s: float = Field(gt=0, le=1e6, description="host link bandwidth per direction (KV swap)")
    efficiency: Efficiency = Efficiency()

    def peak_flops(self, dtype: str) -> float:
        """FLOP/s of the weight GEMMs in ``dtype`` (fp8 on a GPU without fp8 tensor cores: bf16's)."""
        tflops = self.fp8_tflops if dtype == "fp8" and self.fp8_tflops else self.bf16_tflops
        return tflops * 1e12


def builtin_hardware() -> dict[str, Path]:
    folder = resources.files("kvsched.executors") / "data" / "hardware"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".json")}


def load_hardware(source: str | Path | Hardware) -> Hardware:
    """A built-in GPU by name (``h100-sxm``, ...) or a hardware JSON file."""
    if isinstance(source, Hardware):
        return source
    builtin = builtin_hardware()
    path = builtin.get(str(source)) or Path(source)
    if str(source) not in builtin and path.suffix != ".json":
        known = ", ".join(sorted(builtin))
        raise HardwareError(f"unknown hardware {str(source)!r}; built in: {known}, or a .json file")
    data = read_json(path, "hardware description")
    try:
        return Hardware.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise HardwareError(
            f"invalid hardware description: {f'field {where!r}: ' if where else ''}{first['msg']}", path
        ) from None
