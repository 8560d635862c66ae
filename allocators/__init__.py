"""Paged KV-cache allocation: block pools with ref counts, block tables, copy-on-write, swap, prefix cache."""

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.allocators.block_manager import BlockManager
from kvsched.allocators.block_pool import BlockPool

__all__ = ["AllocStatus", "BlockManager", "BlockPool"]
