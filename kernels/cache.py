"""The paged KV cache: one tensor per device pool, viewed per layer as ``[num_blocks, block_size, num_kv_heads,
head_dim]``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvsched.kernels.block_ops import copy_blocks, swap_blocks

_BLOCK_DIM = 2  # axis of the block id in the stacked [2, layers, blocks, block_size, heads, dim] pools


class PagedKVCache:
    """K and V for every layer in a GPU pool (on the model's device) and a CPU swap pool.

    Block ids are the block manager's: GPU block ``b`` is ``gpu[:, layer, b]``, CPU block ``c`` is
    ``cpu[:, layer, c]``. The executor applies the scheduler's block movements with
    ``swap_out``/``swap_in``/``copy`` and the attention writes and reads through ``key``/``value``.
    """

    def __init__(
        self,
        num_layers: int,
        num_gpu_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        shape = (2, num_layers, num_gpu_blocks, block_size, num_kv_heads, head_dim)
        self.gpu = torch.zeros(shape, dtype=dtype, device=device)
        pin = torch.device(device).type == "cuda"
        self.cpu = torch.zeros(
            (2, num_layers, num_cpu_blocks, block_size, num_kv_heads, head_dim), dtype=dtype, pin_memory=pin
        )

    def key(self, layer: int) -> torch.Tensor:
        return self.gpu[0, layer]

    def value(self, layer: int) -> torch.Tensor:
        return self.gpu[1, layer]

    @property
    def bytes_per_block(self) -> int:
        """K and V bytes of one block over all layers (what a swap of one block moves)."""
        return self.gpu[:, :, 0].numel() * self.gpu.element_size()

    def swap_out(self, pairs: Sequence[tuple[int, int]]) -> None:
        """(gpu, cpu) pairs: preempted by swapping, the group's K/V goes to the CPU pool."""
        swap_blocks(self.gpu, self.cpu, pairs, _BLOCK_DIM)

    def swap_in(self, pairs: Sequence[tuple[int, int]]) -> None:
        """(cpu, gpu) pairs: a swapped group comes back."""
        swap_blocks(self.cpu, self.gpu, pairs, _BLOCK_DIM)

    def copy(self, pairs: Sequence[tuple[int, int]]) -> None:
        """(src, dst) copy-on-write pairs inside the GPU pool."""
        copy_blocks(self.gpu, pairs, _BLOCK_DIM)
