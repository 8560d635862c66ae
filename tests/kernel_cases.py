"""Random paged-attention problems shared by the kernel tests: shuffled block tables, mixed query/context lengths."""

from __future__ import annotations

import os
import sys

import torch


def _import_triton_interpreted() -> None:
    """Import Triton with ``TRITON_INTERPRET=1`` before anything else does (CPU-only machines).

    ``triton.jit`` decides at decoration time whether a function is interpreted, and that includes
    ``tl.max``/``tl.sum``/``tl.zeros`` in Triton's own standard library: if Triton was first imported
    without the variable (loading a transformers model does import it), interpreted kernels fail.
    Test modules are imported at collection, before any test loads a model.
    """
    if torch.cuda.is_available() or "triton" in sys.modules:
        return
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401

        import kvsched.kernels.triton_attention  # noqa: F401
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


_import_triton_interpreted()

# (query tokens, total tokens) per sequence: decode at 1 and at block edges, prefill, chunked
# prefill continuing after cached tokens, and a prompt of exactly one token.
MIXED = [(1, 1), (1, 17), (5, 5), (3, 20), (1, 33), (16, 16), (7, 24), (1, 8), (2, 9)]


def make_problem(cases, num_heads, num_kv_heads, head_dim, block_size, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-s // block_size) for _, s in cases)
    num_blocks = max(len(cases) * max_blocks + 3, 8)
    perm = torch.randperm(num_blocks, generator=g)
    tables = torch.zeros(len(cases), max_blocks, dtype=torch.int32)
    used = 0
    for i, (_, s) in enumerate(cases):
        n = -(-s // block_size)
        tables[i, :n] = perm[used : used + n]
        used += n
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g).to(dtype)
    total_q = sum(q for q, _ in cases)
    q = torch.randn(total_q, num_heads, head_dim, generator=g).to(dtype)
    cu = torch.tensor([0] + [sum(c[0] for c in cases[: i + 1]) for i in range(len(cases))], dtype=torch.int32)
    lens = torch.tensor([s for _, s in cases], dtype=torch.int32)
    to = lambda t: t.to(device)  # noqa: E731
    return to(q), to(k_cache), to(v_cache), to(cu), to(lens), to(tables), head_dim**-0.5


def tolerance(dtype):
    """fp32 tight; half types as vLLM's kernel tests."""
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1.5e-2, rtol=1e-2)


def interpreted_triton():
    """Reload the Triton kernel module so that ``triton.jit`` interprets it on a CPU-only machine.

    Returns a function that restores ``TRITON_INTERPRET`` (the reloaded kernel stays interpreted).
    """
    import importlib

    previous = os.environ.get("TRITON_INTERPRET")
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    import kvsched.kernels.triton_attention as module

    if type(module._paged_attention_kernel).__name__ != "InterpretedFunction" and not torch.cuda.is_available():
        importlib.reload(module)  # reloading an already interpreted kernel confuses the interpreter

    def restore() -> None:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous

    return restore
