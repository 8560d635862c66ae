"""The engine settings of a simulated job: the names a user may set, and defaults that fit the profile.

``EngineConfig``'s own defaults (2,048 blocks, a 2,048-token budget that is also the model length)
fit no model in particular, and stay as they are for code that builds an engine itself. A job
simulated on a profile that names its model's context length and its device's KV memory starts
where vLLM would start on that model and device: ``max_model_len`` is the context length,
``num_gpu_blocks`` what vLLM's memory profiling leaves for the KV cache, and, for a policy without
chunked prefill, ``max_num_batched_tokens = max(max_model_len, 2048)``, as vLLM v0 sets it so
that every prompt the model takes fits one step. A policy that declares ``chunked_prefill``
splits long prompts into chunks, so its budget is a chunk size, not a length limit: it keeps
2,048 (vLLM 0.32's default on an A100). Whatever the caller set (``--set``, or fields given to
``EngineConfig``) and the policy's own ``engine_defaults`` win.
"""

from __future__ import annotations

from typing import Any

from kvsched.core.config import EngineConfig
from kvsched.core.plugins import engine_defaults, policy_attribute
from kvsched.executors.cost_model import CostProfile

V0_MIN_BATCHED_TOKENS = 2048  # vLLM v0: max_num_batched_tokens = max(max_model_len, 2048) without chunked prefill


def check_names(names, option: str = "--set") -> None:
    """Raise ``ValueError`` naming the first of ``names`` that is no ``EngineConfig`` setting, and the valid ones."""
    for name in names:
        if name not in EngineConfig.model_fields:
            raise ValueError(f"{option}: unknown engine setting {name!r}; valid: {', '.join(EngineConfig.model_fields)}")


def fit_to_profile(config: EngineConfig, profile: CostProfile, policy: Any) -> EngineConfig:
    """``config`` with the settings it leaves unset taken from ``profile`` (``policy``: the policy
    object, for its ``chunked_prefill`` and ``engine_defaults`` declarations)."""
    fitted: dict[str, int] = {}
    if profile.max_model_len is not None:
        fitted["max_model_len"] = profile.max_model_len
    blocks = profile.num_kv_blocks(config.block_size)
    if blocks is not None:
        fitted["num_gpu_blocks"] = blocks
    defaults = engine_defaults(policy)
    given = config.model_fields_set | set(defaults)
    fitted = {k: v for k, v in fitted.items() if k not in given}
    chunks = policy_attribute(policy, "chunked_prefill", False) and config.enable_chunked_prefill  # off: as vLLM V1 raises it too
    if not chunks and "max_num_batched_tokens" not in given:
        # the model length the engine will run with: the caller's, else the policy's, else the profile's
        model_len = EngineConfig.model_construct(**{**defaults, **fitted, **config.model_dump(exclude_unset=True)}).model_len
        fitted["max_num_batched_tokens"] = max(model_len, V0_MIN_BATCHED_TOKENS)
    fitted = {k: v for k, v in fitted.items() if v != getattr(config, k)}
    if not fitted:
        return config
    return EngineConfig.model_validate({**fitted, **config.model_dump(exclude_unset=True)})
