"""Read-only windows onto engine state: what a policy may look at but never change."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsched.allocators.alloc_status import AllocStatus
    from kvsched.allocators.block_manager import BlockManager
    from kvsched.core.request import Request
    from kvsched.core.sequence import SequenceGroup, SequenceStatus


class GroupView:
    """A request as a policy sees it. Every attribute is read-only; pass the view back to the
    step's operations (``admit``, ``advance``, ``swap_in``, ``preempt``) to act on it."""

    __slots__ = ("_group",)

    def __init__(self, group: SequenceGroup) -> None:
        self._group = group

    request_id = property(lambda self: self._group.request_id, doc="the request's id")
    request: Request = property(lambda self: self._group.request, doc="the validated request (immutable)")
    arrival_time = property(lambda self: self._group.arrival_time)
    priority = property(lambda self: self._group.request.priority, doc="lower is more urgent")
    tenant = property(lambda self: self._group.request.tenant)
    prompt_len = property(lambda self: self._group.request.prompt_len)
    max_tokens = property(lambda self: self._group.request.sampling.max_tokens)
    status: SequenceStatus = property(lambda self: self._group.status)
    num_seqs = property(lambda self: self._group.num_unfinished_seqs, doc="unfinished sequences")
    max_running_seqs = property(lambda self: self._group.max_running_seqs, doc="sequences it needs at once")
    num_generated_tokens = property(lambda self: self._group.num_generated_tokens)
    num_uncomputed_tokens = property(lambda self: self._group.num_uncomputed_tokens, doc="tokens its next step computes")
    num_preemptions = property(lambda self: self._group.num_recompute_preemptions + self._group.num_swap_preemptions)
    first_scheduled_time = property(lambda self: self._group.first_scheduled_time)
    first_token_time = property(lambda self: self._group.first_token_time)

    @property
    def num_tokens(self) -> int:
        """Tokens of its longest sequence (prompt plus generated)."""
        return max(s.num_tokens for s in self._group.seqs)

    @property
    def expected_output_len(self) -> int | None:
        """The workload's true output length (an oracle, known only in simulation)."""
        return self._group.request.output_len

    def __repr__(self) -> str:
        return f"<{self._group.request_id} {self._group.status.name}>"


class QueueView(Sequence):
    """One queue as it was when the step began, as ``GroupView``s, front first.

    Lazy: a policy that stops at the first group that does not fit pays for the groups it looked
    at, not for the whole queue (which can hold many thousands under overload). Valid for the
    step it was handed out in.
    """

    __slots__ = ("_groups",)

    def __init__(self, groups: list[SequenceGroup]) -> None:
        self._groups = groups

    def __len__(self) -> int:
        return len(self._groups)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(g.view for g in self._groups[index])
        return self._groups[index].view

    def __iter__(self) -> Iterator[GroupView]:
        return (g.view for g in self._groups)

    def __reversed__(self) -> Iterator[GroupView]:
        return (g.view for g in reversed(self._groups))

    def __repr__(self) -> str:
        return f"QueueView({[g.request_id for g in self._groups]})"


class CacheView:
    """Read-only questions to the block manager."""

    __slots__ = ("_bm",)

    def __init__(self, bm: BlockManager) -> None:
        self._bm = bm

    block_size = property(lambda self: self._bm.block_size)
    num_gpu_blocks = property(lambda self: self._bm.gpu.num_blocks)
    num_cpu_blocks = property(lambda self: self._bm.cpu.num_blocks)
    num_free_gpu_blocks = property(lambda self: self._bm.gpu.num_free)
    num_free_cpu_blocks = property(lambda self: self._bm.cpu.num_free)
    num_cached_gpu_blocks = property(lambda self: len(self._bm.gpu.evictor), doc="free blocks that still hold a cached prefix (counted as free)")
    watermark_blocks = property(lambda self: self._bm.watermark_blocks)
    enable_prefix_caching = property(lambda self: self._bm.enable_prefix_caching)

    def can_allocate(self, group: GroupView) -> AllocStatus:
        """The block manager's own answer (vLLM's watermark rule) for a waiting group."""
        return self._bm.can_allocate(group._group)

    def blocks_to_allocate(self, group: GroupView) -> int:
        return self._bm.blocks_to_allocate(group._group)

    def num_cached_tokens(self, group: GroupView) -> int:
        """Leading prompt tokens already in the prefix cache (0 without prefix caching)."""
        return max((self._bm.num_cached_tokens(s) for s in group._group.seqs), default=0)

    def can_append_slots(self, group: GroupView) -> bool:
        return self._bm.can_append_slots(group._group)
