"""Read-only windows onto engine state: what a policy or an observer may look at but never change.

A view holds nothing of what it shows: the core finds that by the view's identity in a table no plugin is handed
(``SHOWN``; a request's view in ``GROUPS``), so even a view whose ``__class__`` was switched finds nothing. The
engine's pydantic objects (config, requests) are handed out as named-tuple copies (``frozen``), which nothing can write.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import attrgetter
from types import NoneType
from typing import TYPE_CHECKING, NamedTuple
from weakref import ref

from pydantic import BaseModel

from kvsched.errors import quote

if TYPE_CHECKING:
    from kvsched.allocators.alloc_status import AllocStatus
    from kvsched.core.request import Request
    from kvsched.core.sequence import SequenceGroup, SequenceStatus


class _Table(dict):
    """What each live view shows, by a weak reference to it (``SHOWN[view.__weakref__]``), or raises."""

    def __missing__(self, key: ref | None):
        raise ReferenceError(
            f"this {'view' if key is None else type(key()).__name__} shows nothing: one a step handed out is valid "
            "only during that step, and one made otherwise than by the core shows nothing"
        )


SHOWN = _Table()


def _forget(key: ref) -> None:
    """A view went: its entry goes (never a live view's, so nothing can break one by calling this)."""
    if key() is None:
        del SHOWN[key]


def show(view: object, target: object, handed: list | None = None) -> None:
    """``view`` shows ``target`` while it lives, or, one a step hands out (kept in ``handed``), until ``forget``."""
    SHOWN[key := ref(view, _forget) if handed is None else ref(view)] = target
    if handed is not None:
        handed.append(key)


def forget(handed: list) -> None:
    """A step closed: what the views it handed out showed is let go."""
    for key in handed:
        SHOWN.pop(key, None)


def shown(view: object):
    """What ``view`` shows, found by its first weak reference (no new one made)."""
    return SHOWN[view.__weakref__]


class Window:
    """A view of what the core shows it (``Window(target, handed=None)``), holding none of it."""

    __slots__ = ("__weakref__",)
    __init__ = show


UNKNOWABLE = ("output_len",)  # no scheduler knows the answer's length: a hook sees max_tokens, the cap (docs/hooks.md)


def frozen(model: BaseModel) -> tuple:
    """A pydantic model (a ``Request``, the ``EngineConfig``) as hooks get it: a named tuple of its fields (nested
    models likewise, ``UNKNOWABLE`` ones left out) and properties. A frozen model is writable through ``__dict__``."""
    record = _record_type(type(model))
    return record._make([frozen(v) if isinstance(v, BaseModel) else v for v in map(model.__dict__.get, record._fields)])


def true_output_len(view: GroupView) -> int | None:  # not on the view: the oracle length predictor's door
    return GROUPS[view]().request.output_len


@functools.cache
def _record_type(cls: type) -> type:
    record = namedtuple(cls.__name__, [f for f in cls.model_fields if f not in UNKNOWABLE], module=cls.__module__)
    for klass in cls.__mro__[cls.__mro__.index(BaseModel) - 1 :: -1]:
        for name, attr in vars(klass).items():
            if isinstance(attr, property):
                setattr(record, name, attr)
    record.__doc__ = f"A read-only copy of a {cls.__name__} (core.view.frozen): its fields and properties"
    return record


class GroupView:
    """A request as a policy sees it, read-only; pass it to the step's operations to act on it."""

    __slots__ = ("__weakref__",)

    request_id = property(lambda self: GROUPS[self]().request_id, doc="the request's id")

    @property
    def request(self) -> Request:
        """The request as a read-only copy (``frozen``), made on its first read."""
        group = GROUPS[self]()
        if group.request_copy is None:
            group.request_copy = frozen(group.request)
        return group.request_copy

    arrival_time = property(lambda self: GROUPS[self]().arrival_time)
    priority = property(lambda self: GROUPS[self]().request.priority, doc="lower is more urgent")
    tenant = property(lambda self: GROUPS[self]().request.tenant)
    session_id = property(lambda self: GROUPS[self]().request.session_id, doc="the conversation it continues, or None")
    slo_class = property(lambda self: GROUPS[self]().request.slo_class, doc="its service class, or None")
    grammar_ready_at = property(lambda self: GROUPS[self]().grammar_ready_at, doc="when its grammar is compiled")
    last_queued_time = property(lambda self: GROUPS[self]().last_queued_time, doc="when it last joined the queue")
    prompt_len = property(lambda self: GROUPS[self]().request.prompt_len)
    max_tokens = property(lambda self: GROUPS[self]().request.sampling.max_tokens)
    status: SequenceStatus = property(lambda self: GROUPS[self]().status)
    num_seqs = property(lambda self: GROUPS[self]().num_unfinished_seqs, doc="unfinished sequences")
    max_running_seqs = property(lambda self: GROUPS[self]().max_running_seqs, doc="sequences it needs at once")
    num_generated_tokens = property(lambda self: GROUPS[self]().num_generated_tokens)
    num_uncomputed_tokens = property(lambda self: GROUPS[self]().num_uncomputed_tokens)
    num_preemptions = property(lambda self: (g := GROUPS[self]()).num_recompute_preemptions + g.num_swap_preemptions)
    first_scheduled_time = property(lambda self: GROUPS[self]().first_scheduled_time)
    first_token_time = property(lambda self: GROUPS[self]().first_token_time)
    finish_time = property(lambda self: GROUPS[self]().finish_time)
    num_tokens = property(lambda self: max(s.num_tokens for s in GROUPS[self]().seqs), doc="of its longest sequence")
    num_computed_tokens = property(
        lambda self: max(s.num_computed_tokens for s in GROUPS[self]().seqs), doc="of its furthest sequence"
    )

    def __repr__(self) -> str:
        g = group_of(self)
        return "<a GroupView that shows nothing>" if g is None else f"<{g.request_id} {g.status.name}>"


# Each request's view -> a weak reference to its group: a view its engine let go (or a forged one) raises KeyError.
GROUPS: dict[GroupView, ref] = {}


def view_of(group: SequenceGroup) -> GroupView:
    """``group``'s view (made once: ``group.view``), showing it until its engine lets it go."""
    GROUPS[view] = ref(group, functools.partial(_gone, view := GroupView()))  # a KeyedRef's Python calls, in C
    return view


def _gone(view: GroupView, key: ref) -> None:  # a group went before its engine let it go (the engine, a fan-out child)
    GROUPS.pop(view, None)


def group_of(view: object, _key=GROUPS.get, _none=NoneType) -> SequenceGroup | None:
    """The group ``view`` shows, or None; the hottest callers inline its one line."""
    return _key(view, _none)()


def let_go(groups: list[SequenceGroup]) -> None:
    """Their engine let ``groups`` go (emptied here): their views show nothing from now on."""
    for group in groups:
        GROUPS.pop(group.view, None)
    groups.clear()


class _LazyTuple(Window, Sequence):
    """A read-only sequence over a core list, each item converted as it is read (``_show``)."""

    __slots__ = ()

    def __len__(self) -> int:
        return len(SHOWN[self.__weakref__])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(map(self._show, SHOWN[self.__weakref__][index]))
        return self._show(SHOWN[self.__weakref__][index])

    def __iter__(self) -> Iterator:
        return map(self._show, SHOWN[self.__weakref__])


class QueueView(_LazyTuple):
    """A queue as ``GroupView``s, front first; lazy: a queue under overload holds many thousands."""

    __slots__ = ()
    _show = attrgetter("view")

    def __repr__(self) -> str:
        return f"QueueView({[g.request_id for g in shown(self)]})"


class GroupMap(Window, Mapping):
    """The engine's requests by id as ``GroupView``s (``Engine.groups``), read-only and live."""

    __slots__ = ()

    def __getitem__(self, request_id: str) -> GroupView:
        return shown(self)[request_id].view

    def __iter__(self) -> Iterator[str]:
        return iter(shown(self))

    def __len__(self) -> int:
        return len(shown(self))

    def __repr__(self) -> str:
        return f"GroupMap({list(shown(self))})"

    __eq__, __hash__ = object.__eq__, object.__hash__  # a view is itself (the table finds it so), not its items


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


class OutputView(Window):
    """A step's ``SchedulerOutput`` as observers see it: read-only, groups as ``GroupView``s, lists as tuples."""

    __slots__ = ()

    scheduled = property(lambda self: BatchView(shown(self).scheduled))
    swapped_in = property(lambda self: tuple(g.view for g in shown(self).swapped_in))
    preempted = property(lambda self: tuple([v._replace(group=v.group.view) for v in shown(self).preempted]))
    ignored = property(lambda self: tuple(g.view for g in shown(self).ignored))
    blocks_to_swap_in = property(lambda self: tuple(shown(self).blocks_to_swap_in))
    blocks_to_swap_out = property(lambda self: tuple(shown(self).blocks_to_swap_out))
    blocks_to_copy = property(lambda self: tuple(shown(self).blocks_to_copy))
    decisions = property(lambda self: tuple(shown(self).decisions), doc="the step's Decision notes, in order")
    num_batched_tokens = property(lambda self: shown(self).num_batched_tokens)
    prefill_tokens = property(lambda self: shown(self).prefill_tokens)
    decode_seqs = property(lambda self: shown(self).decode_seqs)
    kv_tokens_read = property(lambda self: shown(self).kv_tokens_read)
    lane_decodes = property(lambda self: shown(self).lane_decodes)
    num_prefill_groups = property(lambda self: shown(self).num_prefill_groups)
    features = property(lambda self: shown(self).features)
    is_empty = property(lambda self: shown(self).is_empty)


class CacheView(Window):
    """Read-only questions to the block manager (about groups of its own engine only)."""

    __slots__ = ()

    block_size = property(lambda self: shown(self).block_size)
    num_gpu_blocks = property(lambda self: shown(self).gpu.num_blocks)
    num_cpu_blocks = property(lambda self: shown(self).cpu.num_blocks)
    num_free_gpu_blocks = property(lambda self: shown(self).gpu.num_free)
    num_free_cpu_blocks = property(lambda self: shown(self).cpu.num_free)
    num_cached_gpu_blocks = property(lambda self: len(shown(self).gpu.evictor), doc="free blocks holding a prefix")
    watermark_blocks = property(lambda self: shown(self).watermark_blocks)
    enable_prefix_caching = property(lambda self: shown(self).enable_prefix_caching)

    def can_allocate(self, group: GroupView) -> AllocStatus:
        """The block manager's own answer (vLLM's watermark rule) for a waiting group."""
        return shown(self).can_allocate(self._own(group))

    def blocks_to_allocate(self, group: GroupView) -> int:
        return shown(self).blocks_to_allocate(self._own(group))

    def num_cached_tokens(self, group: GroupView) -> int:
        """Leading prompt tokens already in the prefix cache (0 without prefix caching)."""
        bm = shown(self)
        return max((bm.num_cached_tokens(s) for s in self._own(group).seqs), default=0)

    def cached_prefix_blocks(self, hashes: Iterable[int]) -> int:
        """Leading blocks of ``hashes`` (a prompt's prefix hashes, as routers make them) the GPU prefix cache holds."""
        gpu, n = shown(self).gpu, 0
        for content_hash in hashes:
            if gpu.lookup(content_hash) is None:
                break
            n += 1
        return n

    def can_append_slots(self, group: GroupView) -> bool:
        return shown(self).can_append_slots(self._own(group))

    def blocks_held(self, group: GroupView) -> tuple[int, int]:
        """The ``(gpu, cpu)`` blocks a group's sequences hold, a shared block counted once."""
        return shown(self).blocks_held(self._own(group))

    def _own(self, view: GroupView) -> SequenceGroup:
        g = group_of(view) if type(view) is GroupView else None
        if g is None or g.block_manager is not shown(self):
            raise ValueError(f"the cache was asked about {quote(view)}, which is not a request of its engine")
        return g
