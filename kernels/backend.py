"""Which paged-attention implementation to run: Triton on CUDA, vectorised torch otherwise.

``TRITON_INTERPRET=1`` selects Triton on the CPU too (tests); ``KVSCHED_ATTENTION`` (``torch``,
``triton`` or ``loop``) overrides the choice.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import torch

BACKENDS = ("torch", "triton", "loop")


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def choose_backend(device: str | torch.device = "cpu", requested: str | None = None) -> str:
    """The backend name for tensors on ``device`` (``requested`` or the env override wins if valid)."""
    requested = requested or os.environ.get("KVSCHED_ATTENTION") or None
    if requested is not None:
        if requested not in BACKENDS:
            raise ValueError(f"unknown attention backend {requested!r}; choose one of {', '.join(BACKENDS)}")
        if requested == "triton" and not triton_available():
            raise ValueError("attention backend 'triton' needs the triton package")
        return requested
    on_cuda = torch.device(device).type == "cuda"
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if triton_available() and (on_cuda or interpreted):
        return "triton"
    return "torch"


def get_attention(name: str) -> Callable[..., torch.Tensor]:
    """The function for a backend name; Triton is imported only when asked for."""
    if name == "triton":
        from kvsched.kernels.triton_attention import paged_attention_triton

        return paged_attention_triton
    if name == "loop":
        from kvsched.kernels.reference import paged_attention_loop

        return paged_attention_loop
    if name == "torch":
        from kvsched.kernels.torch_attention import paged_attention_torch

        return paged_attention_torch
    raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")


def paged_attention(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale, backend: str | None = None):
    """Dispatch to the backend chosen for ``q``'s device."""
    return get_attention(choose_backend(q.device, backend))(
        q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale
    )
