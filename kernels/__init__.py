"""Kernels for the real executor: the paged KV cache, block moves and paged attention backends."""

from kvsched.kernels.backend import BACKENDS, choose_backend, get_attention, paged_attention
from kvsched.kernels.block_ops import copy_blocks, reshape_and_cache, swap_blocks
from kvsched.kernels.cache import PagedKVCache
from kvsched.kernels.reference import paged_attention_loop
from kvsched.kernels.torch_attention import paged_attention_torch

__all__ = [
    "BACKENDS",
    "PagedKVCache",
    "choose_backend",
    "copy_blocks",
    "get_attention",
    "paged_attention",
    "paged_attention_loop",
    "paged_attention_torch",
    "reshape_and_cache",
    "swap_blocks",
]
