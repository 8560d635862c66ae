"""Finding a cost profile: by name (built in), by path (a JSON file written by ``engine calibrate``), or
derived from a model config and a GPU (``roofline_profile``: ``engine run --hardware --model-config``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from kvsched.errors import KvschedError
from kvsched.executors.cost_model import PROFILES, CostProfile, StepCost
from kvsched.executors.hardware import Hardware, load_hardware
from kvsched.executors.model_config import ModelShape, load_model_shape
from kvsched.executors.roofline import RooflineProfile
from kvsched.userfiles.reader import read_json


class ProfileError(KvschedError):
    """The requested cost profile does not exist or its file is invalid."""


def resolve_profile(profile: str | Path | StepCost) -> StepCost:
    """A built-in profile by name, a ``engine calibrate`` JSON file, or a profile object as it is."""
    if not isinstance(profile, (str, Path)):  # CostProfile, RooflineProfile, or one wrapping them
        return profile
    text = str(profile)
    if text in PROFILES:
        return PROFILES[text]
    path = Path(text)
    if path.suffix == ".json":
        try:
            return CostProfile.model_validate(read_json(path, "cost profile"))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "the whole file"
            raise ProfileError(f"{path}: invalid cost profile: {where}: {first['msg']}") from None
    raise ProfileError(
        f"unknown cost profile {text!r}; available: {', '.join(PROFILES)}, or a .json file from `engine calibrate`"
    )


def roofline_profile(
    hardware: str | Path | Hardware, model: str | Path | ModelShape, tp: int = 1, dtype: str | None = None, **settings
) -> RooflineProfile:
    """The roofline profile of ``model`` (a shipped name, a config.json or its folder) on ``tp`` GPUs of
    ``hardware`` (a built-in name or a JSON file); ``dtype`` overrides the config's (``settings``:
    ``gpu_memory_utilization``, ``max_num_batched_tokens``, ``max_model_len``)."""
    shape = model if isinstance(model, ModelShape) else load_model_shape(model)
    gpu = load_hardware(hardware)
    if tp < 1:
        raise ProfileError(f"--tp must be a positive number of GPUs, got {tp}")
    shape.check_tp(tp, model if not isinstance(model, ModelShape) else shape.name)
    dtype = dtype or ("bf16" if shape.dtype == "fp32" else shape.dtype)  # vLLM serves an fp32 checkpoint in 16 bits
    if dtype not in ("bf16", "fp16", "fp8"):
        raise ProfileError(f"--dtype must be bf16, fp16 or fp8, got {dtype!r}")
    name = f"{shape.name}-{gpu.name}-tp{tp}-{dtype}"
    description = (
        f"{shape.name} ({shape.architecture}, {shape.num_params() / 1e9:.1f} B parameters) "
        f"on {tp} x {gpu.name}, "
        f"{dtype} weights: a roofline, its efficiencies "
        + (f"fitted to {gpu.efficiency.fitted_on}" if gpu.efficiency.fitted_on else "not fitted (priors)")
    )
    return RooflineProfile(
        name=name, description=description, model=shape, hardware=gpu, tp=tp, dtype=dtype, **settings
    )
