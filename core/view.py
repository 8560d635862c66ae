"""Read-only windows onto engine state: what a policy or an observer may look at but never change.

A view keeps what it shows in a *hidden slot*, whose descriptor is taken off the class, so that no
attribute of a view leads to engine state, and hands out the engine's pydantic objects (config,
requests) as named-tuple copies (``frozen``), which nothing can write (code that imports the core or
walks the garbage collector can reach anything: Python has no private memory).
"""

from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

from pydantic import BaseModel

from kvsched.core.errors import quote

if TYPE_CHECKING:
    from kvsched.allocators.alloc_status import AllocStatus
    from kvsched.allocators.block_manager import BlockManager
    from kvsched.core.config import PreemptionMode
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.request import Request
    from kvsched.core.sequence import SequenceGroup, SequenceStatus


def hidden_slot(cls: type, name: str):
    """Take slot ``name`` off ``cls``'s attributes; return its (getter, setter) for the core."""
    slot = cls.__dict__[name]
    delattr(cls, name)
    return slot.__get__, slot.__set__


UNKNOWABLE = ("output_len",)  # no scheduler knows the answer's length: a hook sees max_tokens, the cap (docs/hooks.md)


def frozen(model: BaseModel) -> tuple:
    """A read-only copy of a frozen pydantic model (a ``Request``, its ``SamplingParams``, the ``EngineConfig``) as hooks
    are handed it: a named tuple of its fields (nested models likewise; ``UNKNOWABLE`` ones left out) with its properties.
    A frozen pydantic object is still writable through ``__dict__`` or ``object.__setattr__``; a tuple is not, by any path."""
    return _record_type(type(model))._make([frozen(v) if isinstance(v, BaseModel) else v for v in map(model.__dict__.get, _record_type(type(model))._fields)])


def true_output_len(view: GroupView) -> int | None:  # the answer's length, not on the view: a named predictor's door
    return group_of(view).request.output_len


@functools.cache
def _record_type(cls: type) -> type:
    record = namedtuple(cls.__name__, [f for f in cls.model_fields if f not in UNKNOWABLE], module=cls.__module__)
    for klass in cls.__mro__[cls.__mro__.index(BaseModel) - 1::-1]:
        for name, attr in vars(klass).items():
            if isinstance(attr, property):
                setattr(record, name, attr)
    record.__doc__ = f"A read-only copy of a {cls.__name__} (core.view.frozen): its fields and properties, in a named tuple"
    return record


class GroupView:
    """A request as a policy sees it. Every attribute is read-only; pass the view back to the
    step's operations (``admit``, ``advance``, ``swap_in``, ``preempt``) to act on it."""

    __slots__ = ("_group", "_request")

    def __init__(self, group: SequenceGroup) -> None:
        _set_group(self, group)
        _set_request(self, None)

    request_id = property(lambda self: group_of(self).request_id, doc="the request's id")

    @property
    def request(self) -> Request:
        """The validated request as a read-only copy (``frozen``: the engine's own is not handed out), made on first use."""
        request = _request_of(self)
        if request is None:
            request = frozen(group_of(self).request)
            _set_request(self, request)
        return request

    arrival_time = property(lambda self: group_of(self).arrival_time)
    priority = property(lambda self: group_of(self).request.priority, doc="lower is more urgent")
    tenant = property(lambda self: group_of(self).request.tenant)
    session_id = property(lambda self: group_of(self).request.session_id, doc="the conversation it continues, or None")
    slo_class = property(lambda self: group_of(self).request.slo_class, doc="its service class, or None")
    grammar_ready_at = property(lambda self: group_of(self).grammar_ready_at, doc="when its structured-output grammar is compiled, or None")
    last_queued_time = property(lambda self: group_of(self).last_queued_time, doc="when it last joined the waiting queue: "
                                "its arrival, or its last preemption by recompute")
    prompt_len = property(lambda self: group_of(self).request.prompt_len)
    max_tokens = property(lambda self: group_of(self).request.sampling.max_tokens)
    status: SequenceStatus = property(lambda self: group_of(self).status)
    num_seqs = property(lambda self: group_of(self).num_unfinished_seqs, doc="unfinished sequences")
    max_running_seqs = property(lambda self: group_of(self).max_running_seqs, doc="sequences it needs at once")
    num_generated_tokens = property(lambda self: group_of(self).num_generated_tokens)
    num_uncomputed_tokens = property(lambda self: group_of(self).num_uncomputed_tokens, doc="tokens its next step computes")
    num_preemptions = property(lambda self: group_of(self).num_recompute_preemptions + group_of(self).num_swap_preemptions)
    first_scheduled_time = property(lambda self: group_of(self).first_scheduled_time)
    first_token_time = property(lambda self: group_of(self).first_token_time)
    finish_time = property(lambda self: group_of(self).finish_time)

    @property
    def num_tokens(self) -> int:
        """Tokens of its longest sequence (prompt plus generated)."""
        return max(s.num_tokens for s in group_of(self).seqs)

    @property
    def num_computed_tokens(self) -> int:
        """KV-computed tokens of its furthest sequence (0 while waiting): what a preemption by recompute throws away."""
        return max(s.num_computed_tokens for s in group_of(self).seqs)

    def __repr__(self) -> str:
        g = group_of(self)
        return f"<{g.request_id} {g.status.name}>"


group_of, _set_group = hidden_slot(GroupView, "_group")
_request_of, _set_request = hidden_slot(GroupView, "_request")


class _LazyTuple(Sequence):
    """A read-only sequence over a core list, converting each item as it is read (``_show``):
    a policy that stops at the first item that does not fit pays for what it looked at."""

    __slots__ = ("_items",)

    def __init__(self, items: list) -> None:
        _set_items(self, items)

    def __len__(self) -> int:
        return len(_items_of(self))

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(map(self._show, _items_of(self)[index]))
        return self._show(_items_of(self)[index])

    def __iter__(self) -> Iterator:
        return map(self._show, _items_of(self))



_items_of, _set_items = hidden_slot(_LazyTuple, "_items")


class QueueView(_LazyTuple):
    """One queue as it was when the step began, as ``GroupView``s, front first.

    Lazy (a queue under overload holds many thousands). Valid for the step it was handed out in.
    """

    __slots__ = ()
    _show = staticmethod(lambda g: g.view)

    def __repr__(self) -> str:
        return f"QueueView({[g.request_id for g in _items_of(self)]})"


class GroupMap(Mapping):
    """The engine's requests by id as ``GroupView``s (``Engine.groups``): read-only, and live (a request added or
    retired shows at once)."""

    __slots__ = ("_groups",)

    def __init__(self, groups: dict[str, SequenceGroup]) -> None:
        _set_groups(self, groups)

    def __getitem__(self, request_id: str) -> GroupView:
        return _groups_of(self)[request_id].view

    def __iter__(self) -> Iterator[str]:
        return iter(_groups_of(self))

    def __len__(self) -> int:
        return len(_groups_of(self))

    def __contains__(self, request_id: object) -> bool:
        return request_id in _groups_of(self)

    def __repr__(self) -> str:
        return f"GroupMap({list(_groups_of(self))})"


_groups_of, _set_groups = hidden_slot(GroupMap, "_groups")


class Scheduled(NamedTuple):
    """One batch entry as an observer sees it (``ScheduledGroup`` with the group as a view)."""

    group: GroupView
    num_tokens: int
    is_prefill: bool
    num_cached_tokens: int


class BatchView(_LazyTuple):
    """A step's batch as ``Scheduled`` entries, in batch order."""

    __slots__ = ()
    _show = staticmethod(lambda s: Scheduled(s.group.view, s.num_tokens, s.is_prefill, s.num_cached_tokens))


class OutputView:
    """A step's ``SchedulerOutput`` as ``on_step`` observers see it: the same names, read-only,
    groups as ``GroupView``s and block movements as tuples (``num_batched_tokens``,
    ``prefill_tokens``, ``decode_seqs``, ``kv_tokens_read``, ``lane_decodes``,
    ``num_prefill_groups``, ``features`` and ``is_empty`` are the output's own)."""

    __slots__ = ("_out",)

    def __init__(self, output: SchedulerOutput) -> None:
        _set_out(self, output)

    scheduled = property(lambda self: BatchView(_out_of(self).scheduled))
    swapped_in = property(lambda self: tuple(g.view for g in _out_of(self).swapped_in))
    preempted: tuple[tuple[GroupView, PreemptionMode], ...] = property(lambda self: tuple((g.view, m) for g, m in _out_of(self).preempted))
    ignored = property(lambda self: tuple(g.view for g in _out_of(self).ignored))
    blocks_to_swap_in = property(lambda self: tuple(_out_of(self).blocks_to_swap_in))
    blocks_to_swap_out = property(lambda self: tuple(_out_of(self).blocks_to_swap_out))
    blocks_to_copy = property(lambda self: tuple(_out_of(self).blocks_to_copy))
    decisions = property(lambda self: tuple(_out_of(self).decisions), doc="why: the step's Decision notes, in order")


for _name in ("num_batched_tokens", "prefill_tokens", "decode_seqs", "kv_tokens_read", "lane_decodes", "num_prefill_groups", "features", "is_empty"):
    setattr(OutputView, _name, property(lambda self, _name=_name: getattr(_out_of(self), _name)))
_out_of, _set_out = hidden_slot(OutputView, "_out")


class CacheView:
    """Read-only questions to the block manager (about groups of its own engine only)."""

    __slots__ = ("_bm",)

    def __init__(self, bm: BlockManager) -> None:
        _set_bm(self, bm)

    block_size = property(lambda self: _bm_of(self).block_size)
    num_gpu_blocks = property(lambda self: _bm_of(self).gpu.num_blocks)
    num_cpu_blocks = property(lambda self: _bm_of(self).cpu.num_blocks)
    num_free_gpu_blocks = property(lambda self: _bm_of(self).gpu.num_free)
    num_free_cpu_blocks = property(lambda self: _bm_of(self).cpu.num_free)
    num_cached_gpu_blocks = property(lambda self: len(_bm_of(self).gpu.evictor), doc="free blocks that still hold a cached prefix (counted as free)")
    watermark_blocks = property(lambda self: _bm_of(self).watermark_blocks)
    enable_prefix_caching = property(lambda self: _bm_of(self).enable_prefix_caching)

    def can_allocate(self, group: GroupView) -> AllocStatus:
        """The block manager's own answer (vLLM's watermark rule) for a waiting group."""
        return _bm_of(self).can_allocate(self._own(group))

    def blocks_to_allocate(self, group: GroupView) -> int:
        return _bm_of(self).blocks_to_allocate(self._own(group))

    def num_cached_tokens(self, group: GroupView) -> int:
        """Leading prompt tokens already in the prefix cache (0 without prefix caching)."""
        bm = _bm_of(self)
        return max((bm.num_cached_tokens(s) for s in self._own(group).seqs), default=0)

    def can_append_slots(self, group: GroupView) -> bool:
        return _bm_of(self).can_append_slots(self._own(group))

    def blocks_held(self, group: GroupView) -> tuple[int, int]:
        """The ``(gpu, cpu)`` blocks a group's sequences hold, a block they share (after a fork) counted once."""
        return _bm_of(self).blocks_held(self._own(group))

    def _own(self, view: GroupView) -> SequenceGroup:
        g = group_of(view) if type(view) is GroupView else None
        if g is None or g.block_manager is not _bm_of(self):
            raise ValueError(f"the cache was asked about {quote(view)}, which is not a request of its engine")
        return g


_bm_of, _set_bm = hidden_slot(CacheView, "_bm")
