"""The engine settings of a simulated job: the names a user may set, and defaults that fit the profile.

``EngineConfig``'s own defaults (2,048 blocks, a 2,048-token budget that is also the model length)
fit no model in particular, and stay as they are for code that builds an engine itself. A job
simulated on a profile that names its model's context length and its device's KV memory starts
where vLLM would start on that model and device: ``max_model_len`` is the context length,
``num_gpu_blocks`` what vLLM's memory profiling leaves for the KV cache, and, for a policy without
chunked prefill, ``max_num_batched_tokens = max(max_model_len, 2048)``, as vLLM v0 sets it so
that every prompt the model takes fits one step. A profile whose decode time depends on each
request's context (a sliding window) turns the decode lane off. A policy that declares ``chunked_prefill``
splits long prompts into chunks, so its budget is a chunk size, not a length limit: it keeps
2,048 (vLLM 0.32's default on an A100). A job under V1 mechanics (``vllm-v1`` and the policies built on
it) starts where ``vllm serve`` starts on the profile's device (``vllm_v1_defaults``): its block size, token
budget and ``max_num_seqs``; ``vllm-v1`` itself declares V1's prefix caching. Whatever the caller set
(``--set``, or fields given to ``EngineConfig``) and the policy's own ``engine_defaults`` win;
``filled_settings`` says what was filled and from where (``summary.json``'s ``defaults``).
"""

from __future__ import annotations

from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.executors.cost_model import StepCost
from kvsched.plugins.identity import engine_defaults, policy_attribute

# vLLM v0: max_num_batched_tokens = max(max_model_len, 2048) without chunked prefill
V0_MIN_BATCHED_TOKENS = 2048
POLICY = "the policy"  # a setting filled from the policy's engine_defaults


def check_names(names, option: str = "--set") -> None:
    """Raise ``ValueError`` naming the first of ``names`` that is no ``EngineConfig`` setting, and the valid ones."""
    for name in names:
        if name not in EngineConfig.model_fields:
            raise ValueError(
                f"{option}: unknown engine setting {name!r}; valid: {', '.join(EngineConfig.model_fields)}"
            )


def vllm_v1_defaults(profile: StepCost) -> tuple[dict[str, int], str]:
    """What ``vllm serve`` (vLLM 0.32, ``EngineArgs.get_batch_defaults`` for its API server, and the platform's block
    size) sets on the profile's device, and the device as it tells them apart: a profile with a GPU's memory is a GPU
    (16-token blocks; a 2,048-token budget and 256 sequences, 8,192 and 1,024 from 70 GiB unless an A100, 16,384 and
    1,024 from 160 GiB), one without is vLLM's CPU backend (128-token blocks, 2,048 tokens, 128 sequences)."""
    if profile.kv_memory is None:
        return {"block_size": 128, "max_num_batched_tokens": 2048, "max_num_seqs": 128}, "vLLM V1 on a CPU"
    gib, name = profile.kv_memory.device_gib, profile.name.lower()
    if gib >= 160:
        tokens, seqs, device = 16384, 1024, "a GPU of 160 GiB or more"
    elif gib >= 70 and "a100" not in name:
        tokens, seqs, device = 8192, 1024, "a GPU of 70 GiB or more"
    else:
        tokens, seqs, device = 2048, 256, "an A100" if "a100" in name else "a GPU under 70 GiB"
    return {"block_size": 16, "max_num_batched_tokens": tokens, "max_num_seqs": seqs}, f"vLLM V1 on {device}"


def filled_settings(config: EngineConfig, profile: StepCost, policy: Any) -> dict[str, dict[str, Any]]:
    """The settings a job fills where ``config`` leaves them unset: ``{name: {"value": v, "from": where}}``, where is
    the policy's ``engine_defaults``, vLLM V1's serving defaults on the profile's device, or the profile."""
    defaults = engine_defaults(policy)
    given = config.model_fields_set
    filled = {k: (v, POLICY) for k, v in defaults.items() if k not in given}
    merged = {**defaults, **config.model_dump(exclude_unset=True)}
    if merged.get("vllm_engine") == "v1":
        served, device = vllm_v1_defaults(profile)
        filled.update({k: (v, device) for k, v in served.items() if k not in given and k not in defaults})
    block_size = filled.get("block_size", (config.block_size,))[0]
    if profile.max_model_len is not None and "max_model_len" not in given and "max_model_len" not in defaults:
        filled["max_model_len"] = (profile.max_model_len, "the profile")
    blocks = profile.num_kv_blocks(block_size)
    if blocks is not None and "num_gpu_blocks" not in given and "num_gpu_blocks" not in defaults:
        filled["num_gpu_blocks"] = (blocks, "the profile")
    if not profile.decode_exact and "decode_lane" not in given:  # a decode's time depends on each context: step by step
        filled["decode_lane"] = (False, "the profile")
    chunks = (
        policy_attribute(policy, "chunked_prefill", False) and config.enable_chunked_prefill
    )  # off: as vLLM V1 raises it too
    if not chunks and "max_num_batched_tokens" not in given and "max_num_batched_tokens" not in defaults:
        # the model length the engine will run with: the caller's, else the policy's, else the profile's
        model_len = EngineConfig.model_construct(**{**{k: v for k, (v, _) in filled.items()}, **merged}).model_len
        filled["max_num_batched_tokens"] = (max(model_len, V0_MIN_BATCHED_TOKENS), "the model length (vLLM v0)")
    return {k: {"value": v, "from": where} for k, (v, where) in filled.items()}


def fit_to_profile(config: EngineConfig, profile: StepCost, policy: Any) -> EngineConfig:
    """``config`` with the settings it leaves unset filled (``filled_settings``; ``policy``: the policy object,
    for its ``chunked_prefill`` and ``engine_defaults`` declarations, which the engine applies itself)."""
    fitted = {k: f["value"] for k, f in filled_settings(config, profile, policy).items() if f["from"] != POLICY}
    fitted = {k: v for k, v in fitted.items() if v != getattr(config, k)}
    if not fitted:
        return config
    return EngineConfig.model_validate({**fitted, **config.model_dump(exclude_unset=True)})
