"""A step under construction, on the core's side, where every rule is enforced: each ``StepBuilder`` operation
validates first, takes or frees blocks at once (the next operation sees exact capacity) and records the queue
changes that the scheduler commits after the hook returns, or rolls back if anything failed.
"""

from __future__ import annotations

import operator
from types import NoneType
from typing import TYPE_CHECKING

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.core.config import PreemptionMode
from kvsched.core.decisions import Decision, DecisionNotes, Ignored, Outcome, Prefill, SwappedIn
from kvsched.core.outputs import ScheduledGroup, SchedulerOutput
from kvsched.core.preemption import Preemptions
from kvsched.core.sequence import SequenceStatus
from kvsched.core.step import StepBuilder
from kvsched.core.view import GROUPS, GroupView, forget, group_of
from kvsched.errors import quote

if TYPE_CHECKING:
    from kvsched.core.plugins import PolicyHooks
    from kvsched.core.scheduler import Scheduler
    from kvsched.core.sequence import Sequence, SequenceGroup

_WAITING, _RUNNING, _SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED
_new = tuple.__new__  # a named tuple made without its __new__'s frame, on the hot paths


class StepState(Preemptions, DecisionNotes):
    """The step's batch, budgets and touched groups, and the operations of ``StepBuilder``."""

    def __init__(self, scheduler: Scheduler, now: float, hooks: PolicyHooks) -> None:
        self.sched = scheduler
        self.bm = scheduler.block_manager
        self.hooks = hooks
        self.config = scheduler.config
        self.now = now
        self.output = SchedulerOutput()
        self.num_running_seqs = scheduler.num_running_seqs
        self.touched: dict[SequenceGroup, str] = {}
        self.max_tokens = self.config.max_num_batched_tokens
        self.max_seqs = self.config.max_num_seqs
        self.prompt_limit = self.config.model_len  # the longest prompt (with any output, if recomputed) admitted
        self.forced_mode = self.config.preemption_mode
        self.admitted: list[SequenceGroup] = []
        self.recomputed: list[SequenceGroup] = []
        self.swapped_out: list[SequenceGroup] = []
        self.cached_tokens: dict[int, int] = {}
        self.ignore_reasons: dict[SequenceGroup, str] = {}
        self.victim_cursor = len(scheduler.running) - 1
        self.open = True  # until the scheduler commits or rolls the step back
        self.step = StepBuilder(self)  # what the hooks are handed
        self.handed: list | None = []  # what the views it hands out show (core/view.py), let go as it closes

    def close(self) -> None:
        self.open = False
        self.step = None  # no cycle with the builder: the step's objects are freed at once, not by the collector
        forget(self.handed)
        self.handed = None  # a view handed out after it lives as long as itself

    def refuse(self, message: str, hook: str | None = None):
        raise self.hooks.refuse(message, hook)

    def newest_unscheduled(self, exclude: GroupView | None) -> GroupView | None:
        running, touched = self.sched.running, self.touched
        skip = group_of(exclude) if exclude is not None else None
        i = self.victim_cursor
        while i >= 0 and (running[i] in touched or running[i] is skip):
            if running[i] in touched:
                self.victim_cursor = i - 1  # touched groups stay touched: never look again
            i -= 1
        return running[i].view if i >= 0 else None

    # ------------------------------------------------------------------ operations
    def admit(self, group: GroupView, max_tokens: int | None) -> Outcome:
        max_tokens = self._tokens_arg(max_tokens, "admit")
        g = self.resolve(group, _WAITING, "admit")
        if g.refused is not None and max_tokens is None and self.bm.gpu.num_free - g.refused < self.bm.watermark_blocks:
            # Refused before for as many blocks and still short: every check ahead of capacity is about the group alone.
            return self._no_blocks(g, g.refused)
        seqs = g.waiting_seqs()
        longest = seqs[0].num_tokens if len(seqs) == 1 else max(s.num_tokens for s in seqs)
        if longest > self.prompt_limit:  # prompt_limit <= model_len: the model's length asked only then
            why = "exceed" if longest > self.config.model_len else "leave no room for an output token within"
            return self._ignore(g, f"{longest} tokens {why} max_model_len ({self.config.model_len})")
        if g.max_running_seqs > self.max_seqs:  # vLLM would keep it forever, blocking the queue
            return self._ignore(g, f"n={g.max_running_seqs} sequences exceed max_num_seqs ({self.max_seqs})")
        cached = self.bm.planned_cached_tokens(g)
        uncomputed = (
            longest - cached[seqs[0].seq_id] if len(seqs) == 1 else sum(s.num_tokens - cached[s.seq_id] for s in seqs)
        )
        chunk = self._chunk(g, uncomputed, max_tokens, "admit")
        if max_tokens is None and uncomputed > self.max_tokens:
            why = f"prompt of {uncomputed} tokens exceeds max_num_batched_tokens ({self.max_tokens})"
            return self._ignore(g, f"{why} without chunked prefill")
        # Capacity before budget, as vLLM does: a NEVER group is dropped even when the budget is spent.
        status = self.hooks.can_allocate(self.step, g.view) if self.hooks.decides_admission else self.bm.can_allocate(g)
        if type(status) is not AllocStatus:
            self.refuse(f"returned {quote(status)}, expected an AllocStatus", "can_allocate")
        if status is AllocStatus.NEVER:
            return self._ignore(g, "prompt can never fit in the GPU KV cache (can_allocate: NEVER)")
        tokens = self.admitted_tokens(g, cached, chunk)
        if status is AllocStatus.LATER:  # g.refused: what can_allocate counted, for the scheduler to prove again
            needed = self.bm.blocks_to_allocate(g, tokens)
            counted = not (self.hooks.decides_admission or self.bm.enable_prefix_caching)
            g.refused = (needed if tokens is None else self.bm.blocks_to_allocate(g)) if counted else None
            return self._no_blocks(g, needed)
        if self._over_budget(g, chunk):
            return Outcome.BUDGET
        needed = self.bm.blocks_to_allocate(g, tokens)
        if needed > self.bm.gpu.num_free:
            self.refuse(
                f"said OK for {quote(g.request_id)}, which needs {needed} blocks with {self.bm.gpu.num_free} free",
                "can_allocate",
            )
        cached = self.bm.allocate(g, tokens)
        g.refused = None
        self.cached_tokens.update(cached)
        self.touched[g] = "admitted"
        self.admitted.append(g)
        self.num_running_seqs += g.max_running_seqs
        hits = sum(cached.values())
        self._record(g, chunk, True, hits, hits, uncomputed - chunk)
        return Outcome.SCHEDULED

    def advance(self, group: GroupView, max_tokens: int | None) -> Outcome:
        max_tokens = self._tokens_arg(max_tokens, "advance")
        g = self.resolve(group, _RUNNING, "advance")
        outcome = self.run_group(g, max_tokens, "advance")
        if outcome is Outcome.SCHEDULED:
            self.touched[g] = "scheduled"
        return outcome

    def swap_in(self, group: GroupView, max_tokens: int | None) -> Outcome:
        max_tokens = self._tokens_arg(max_tokens, "swap_in")
        g = self.resolve(group, _SWAPPED, "swap_in")
        status = self.bm.can_swap_in(g)
        if status is AllocStatus.NEVER:
            return self._ignore(g, "swapped group can never fit back in the GPU KV cache")
        if status is AllocStatus.LATER:
            return self._no_blocks(g, self.bm.blocks_to_swap_in(g))
        uncomputed = g.num_uncomputed_tokens
        chunk = self._chunk(g, uncomputed, max_tokens, "swap_in") if uncomputed > g.num_unfinished_seqs else uncomputed
        if self._over_budget(g, chunk):
            return Outcome.BUDGET
        moved = self.bm.swap_in(g)
        self.output.blocks_to_swap_in += moved
        self.output.decisions.append(SwappedIn(Decision.SWAPPED_IN, g.request_id, len(moved)))
        self.touched[g] = "swapped in"
        self.output.swapped_in.append(g)
        self.num_running_seqs += g.max_running_seqs
        return self.run_group(g, max_tokens, "swap_in", room=True)  # can_swap_in counted each next token's block

    def preempt(self, group: GroupView, mode: PreemptionMode | None) -> PreemptionMode:
        mode = self._mode_arg(mode, "preempt")
        return self.preempt_group(self.resolve(group, _RUNNING, "preempt"), mode)

    def reorder_waiting(self, front) -> None:
        groups, waiting = [self.resolve(v, _WAITING, "reorder_waiting") for v in front], self.sched.waiting
        if self.admitted or self.output.ignored or sorted(map(id, groups)) != sorted(map(id, waiting[: len(groups)])):
            self.refuse("reorder_waiting: expected the first waiting groups, each once, before any admission")
        self.sched.waiting = groups + waiting[len(groups) :]  # a new list: a failed step puts the old one back

    def advance_running(self, stop_on_preempted: bool) -> Outcome:
        fast = self.sched.fast_path  # the simulator's decode lane takes the step's decodes whole when it is exact
        if fast is not None and fast.take(self, False, None):
            return Outcome.SCHEDULED
        touched = self.touched
        for g in self.sched.running:
            if g in touched:
                continue
            outcome = self.run_group(g, None, "advance")
            if outcome is Outcome.SCHEDULED:
                touched[g] = "scheduled"
            elif outcome is Outcome.BUDGET or stop_on_preempted:
                return outcome
        return Outcome.SCHEDULED

    def advance_decodes(self, max_tokens: int | None) -> Outcome:
        max_tokens = self._tokens_arg(max_tokens, "advance_decodes", minimum=None)
        fast = self.sched.fast_path
        if fast is not None and fast.take(self, True, max_tokens):
            return Outcome.SCHEDULED
        touched, out = self.touched, self.output
        left = self.max_tokens if max_tokens is None else max_tokens
        for g in self.sched.running:
            if g in touched or g.num_uncomputed_tokens > g.num_unfinished_seqs:
                continue
            before = out.num_batched_tokens
            if g.num_uncomputed_tokens > left:
                return self.no_tokens(g, g.num_uncomputed_tokens, left)
            outcome = self.run_group(g, None, "advance")
            if outcome is Outcome.SCHEDULED:
                touched[g] = "scheduled"
                left -= out.num_batched_tokens - before
            elif outcome is Outcome.BUDGET:
                return outcome
        return Outcome.SCHEDULED

    # -------------------------------------------------------------------------- mechanics
    def admitted_tokens(self, g: SequenceGroup, cached: dict[int, int], chunk: int) -> int | None:
        """Tokens of an admitted prompt that get blocks now: all of them under vLLM v0 (None)."""
        return None

    def run_group(self, g: SequenceGroup, max_tokens: int | None, op: str, room: bool = False) -> Outcome:
        """Schedule a running group's next tokens (``room``: its blocks are known to fit)."""
        seqs = g.seqs
        if len(seqs) == 1:
            seq = seqs[0]
            if seq.num_tokens - seq.num_computed_tokens == 1:
                return self.decode_one(g, seq, room)
        out = self.output
        uncomputed = g.num_uncomputed_tokens
        is_prefill = uncomputed > g.num_unfinished_seqs
        chunk = self._chunk(g, uncomputed, max_tokens, op) if is_prefill else uncomputed
        if out.num_batched_tokens + chunk > self.max_tokens:
            return self.no_tokens(g, chunk, self.max_tokens - out.num_batched_tokens)
        running = [s for s in seqs if s.status <= _SWAPPED]
        if self.take_blocks(g, running, chunk if is_prefill else 0, room):
            return Outcome.PREEMPTED
        self._record(g, chunk, is_prefill, sum(s.num_computed_tokens for s in running), 0, uncomputed - chunk)
        return Outcome.SCHEDULED

    def take_blocks(self, g: SequenceGroup, running: list[Sequence], chunk: int, room: bool) -> bool:
        """Give ``g``'s sequences the blocks this step's tokens need (``chunk``: 0 for a decode); True if ``g`` was
        preempted for want of them. Under vLLM v0 a prompt got all its blocks at admission."""
        if chunk:
            return False
        if not room and self.make_room(g):
            return True
        for seq in running:
            cow = self.bm.append_slots(seq)
            if cow is not None:
                self.output.blocks_to_copy.append(cow)
        return False

    def decode_one(self, g: SequenceGroup, seq: Sequence, room: bool = False) -> Outcome:
        """``run_group`` for the commonest case, one sequence decoding one token: the hot path."""
        out = self.output
        if out.num_batched_tokens >= self.max_tokens:
            return self.no_tokens(g, 1, self.max_tokens - out.num_batched_tokens)
        if self.bm.gpu.num_free < 1 and not room and self.make_room(g):
            return Outcome.PREEMPTED
        cow = self.bm.append_slots(seq)
        if cow is not None:
            out.blocks_to_copy.append(cow)
        out.scheduled.append(ScheduledGroup(g, 1, False))  # _record(g, 1, False, computed, 0, 0), inlined
        out.num_batched_tokens += 1
        out.decode_seqs += 1
        out.kv_tokens_read += seq.num_computed_tokens
        return Outcome.SCHEDULED

    def _record(self, g: SequenceGroup, chunk: int, is_prefill: bool, context: int, cached: int, left: int) -> None:
        """Add ``g`` to the batch and to the step's cost features (``context``: KV tokens it reads; ``left``: prompt
        tokens left for later chunks)."""
        out = self.output
        out.scheduled.append(ScheduledGroup(g, chunk, is_prefill, cached))
        out.num_batched_tokens += chunk
        if is_prefill:
            out.prefill_tokens += chunk
            out.decisions.append(_new(Prefill, (Decision.PREFILL, g.request_id, chunk, left, cached)))  # no frame
        else:
            out.decode_seqs += chunk
        out.kv_tokens_read += context

    def _chunk(self, g: SequenceGroup, uncomputed: int, max_tokens: int | None, op: str) -> int:
        if max_tokens is None or max_tokens >= uncomputed:
            return uncomputed
        if g.num_unfinished_seqs > 1:
            self.refuse(f"{op}: chunked prefill of {quote(g.request_id)} with several sequences is not supported")
        return max_tokens

    def _ignore(self, g: SequenceGroup, reason: str) -> Outcome:
        self.touched[g] = "ignored"
        self.ignore_reasons[g] = reason
        self.output.ignored.append(g)
        self.output.decisions.append(Ignored(Decision.IGNORED, g.request_id, reason))
        return Outcome.NEVER

    # --------------------------------------------------------------------- validation
    def resolve(self, view: GroupView, expected: SequenceStatus, op: str) -> SequenceGroup:
        if type(view) is not GroupView:
            self.refuse(f"{op}: expected a GroupView, got {quote(view)}")
        g = GROUPS.get(view, NoneType)()  # group_of(view), inlined: once per operation
        if g is None or g.block_manager is not self.bm:
            self.refuse(f"{op}: {quote(view)} is not a request of this engine")
        state = self.touched.get(g)
        if state is not None:
            self.refuse(f"{op}: {quote(g.request_id)} was already {state} in this step")
        if g.status is not expected:
            self.refuse(f"{op}: {quote(g.request_id)} is {g.status.name}, not {expected.name}")
        if (fast := self.sched.fast_path) is not None:  # it may change on its own now (the decode lane dissolves)
            fast.touch(g)
        return g

    def _tokens_arg(self, value, op: str, minimum: int | None = 1) -> int | None:
        """``max_tokens`` as an int or None: a bool, a float or a count below ``minimum`` is refused."""
        if value is None or (type(value) is int and (minimum is None or value >= minimum)):
            return value
        try:
            number = None if isinstance(value, bool) else operator.index(value)  # numpy integers pass
        except TypeError:
            number = None
        if number is None or (minimum is not None and number < minimum):
            self.refuse(
                f"{op}: max_tokens must be {'a positive' if minimum else 'an'} integer or None, got {quote(value)}"
            )
        return number

    def _mode_arg(self, mode, op: str, hook: str | None = None) -> PreemptionMode | None:
        if mode is not None and type(mode) is not PreemptionMode:
            self.refuse(
                f"{op}: mode must be PreemptionMode.SWAP, PreemptionMode.RECOMPUTE or None, got {quote(mode)}", hook
            )
        return mode
