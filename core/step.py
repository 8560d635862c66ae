"""The step builder: the only way a policy changes anything, and the place every rule is enforced.

A policy's ``select_batch`` receives a ``StepBuilder``. Each operation validates the request
(right queue, not yet touched this step, budgets, physical capacity), performs the allocator side
at once (so that capacity seen by the next operation is exact) and records the queue changes,
which the scheduler commits after the hook returns. If the hook raises, the scheduler rolls the
block manager back and nothing of the step remains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.core.config import PreemptionMode
from kvsched.core.decisions import Decision, Outcome, Preemption
from kvsched.core.errors import PolicyError
from kvsched.core.outputs import ScheduledGroup, SchedulerOutput
from kvsched.core.sequence import SequenceStatus
from kvsched.core.step_notes import DecisionNotes
from kvsched.core.view import GroupView, QueueView

if TYPE_CHECKING:
    from kvsched.core.scheduler import Scheduler
    from kvsched.core.sequence import Sequence, SequenceGroup

_WAITING, _RUNNING, _SWAPPED = SequenceStatus.WAITING, SequenceStatus.RUNNING, SequenceStatus.SWAPPED


class StepBuilder(DecisionNotes):
    """One step under construction: read-only queues and budgets plus validated operations (each
    noting why it turned a group away, ``core/step_notes.py``)."""

    def __init__(self, scheduler: Scheduler, now: float) -> None:
        self._sched = scheduler
        self._bm = scheduler.block_manager
        self._hooks = scheduler.hooks
        self.config = scheduler.config
        self.cache = scheduler.cache_view
        self.now = now
        self.output = SchedulerOutput()
        self.num_running_seqs = scheduler.num_running_seqs
        self._touched: dict[SequenceGroup, str] = {}
        self._max_tokens = self.config.max_num_batched_tokens
        self._max_seqs = self.config.max_num_seqs
        self.admitted: list[SequenceGroup] = []
        self.swapped_in: list[SequenceGroup] = self.output.swapped_in
        self.recomputed: list[SequenceGroup] = []
        self.swapped_out: list[SequenceGroup] = []
        self.cached_tokens: dict[int, int] = {}
        self.ignore_reasons: dict[SequenceGroup, str] = {}
        self._victim_cursor = len(scheduler.running) - 1

    # ------------------------------------------------------------------ what a policy reads
    @property
    def waiting(self) -> QueueView:
        """Waiting groups at the start of the step, in queue order (front first)."""
        return QueueView(self._sched.waiting)

    @property
    def running(self) -> QueueView:
        return QueueView(self._sched.running)

    @property
    def swapped(self) -> QueueView:
        return QueueView(self._sched.swapped)

    @property
    def policy_name(self) -> str:
        return self._hooks.name

    @property
    def num_batched_tokens(self) -> int:
        return self.output.num_batched_tokens

    @property
    def remaining_tokens(self) -> int:
        return self._max_tokens - self.output.num_batched_tokens

    @property
    def remaining_seqs(self) -> int:
        return self._max_seqs - self.num_running_seqs

    @property
    def preempted(self) -> tuple[GroupView, ...]:
        return tuple(g.view for g, _ in self.output.preempted)

    @property
    def num_preempted(self) -> int:
        return len(self.output.preempted)

    @property
    def scheduled(self) -> tuple[GroupView, ...]:
        return tuple(s.group.view for s in self.output.scheduled)

    @property
    def admitted_views(self) -> tuple[GroupView, ...]:
        return tuple(g.view for g in self.admitted)

    def was_touched(self, group: GroupView) -> bool:
        """True once ``group`` was scheduled, preempted or ignored in this step."""
        return group._group in self._touched

    def newest_unscheduled(self, exclude: GroupView | None = None) -> GroupView | None:
        """The newest running group not yet touched in this step (vLLM's ``running.pop()``)."""
        running, touched = self._sched.running, self._touched
        skip = exclude._group if exclude is not None else None
        i = self._victim_cursor
        while i >= 0 and (running[i] in touched or running[i] is skip):
            if running[i] in touched:
                self._victim_cursor = i - 1  # touched groups stay touched: never look again
            i -= 1
        return running[i].view if i >= 0 else None

    # ------------------------------------------------------------------- what a policy does
    def admit(self, group: GroupView, max_tokens: int | None = None) -> Outcome:
        """Prefill a waiting group (its first ``max_tokens`` prompt tokens when chunking)."""
        g = self._resolve(group, _WAITING, "admit")
        seqs = [s for s in g.seqs if s.status is _WAITING]
        longest = max(s.num_tokens for s in seqs)
        if longest > self.config.model_len:
            return self._ignore(g, f"{longest} tokens exceed max_model_len ({self.config.model_len})")
        if g.max_running_seqs > self._max_seqs:  # vLLM would keep it forever, blocking the queue
            return self._ignore(g, f"n={g.max_running_seqs} sequences exceed max_num_seqs ({self._max_seqs})")
        cached = self._bm.planned_cached_tokens(g)
        uncomputed = sum(s.num_tokens - cached[s.seq_id] for s in seqs)
        chunk = self._chunk(g, uncomputed, max_tokens, "admit")
        if max_tokens is None and uncomputed > self._max_tokens:
            return self._ignore(g, f"prompt of {uncomputed} tokens exceeds max_num_batched_tokens ({self._max_tokens}) without chunked prefill")
        # Capacity before budget, as vLLM does: a NEVER group is dropped even when the budget is spent.
        status = self._hooks.can_allocate(step=self, group=g.view)
        if not isinstance(status, AllocStatus):
            raise PolicyError(self.policy_name, f"can_allocate returned {status!r}, expected an AllocStatus")
        if status is AllocStatus.NEVER:
            return self._ignore(g, "prompt can never fit in the GPU KV cache (can_allocate: NEVER)")
        if status is AllocStatus.LATER:
            return self._no_blocks(g, self._bm.blocks_to_allocate(g))
        if self._over_budget(g, chunk):
            return Outcome.BUDGET
        needed = self._bm.blocks_to_allocate(g)
        if needed > self._bm.gpu.num_free:
            raise PolicyError(self.policy_name, f"can_allocate said OK for {g.request_id!r}, which needs {needed} blocks with {self._bm.gpu.num_free} free")
        cached = self._bm.allocate(g)
        self.cached_tokens.update(cached)
        self._touched[g] = "admitted"
        self.admitted.append(g)
        self.num_running_seqs += g.max_running_seqs
        hits = sum(cached.values())
        self._record(g, chunk, True, hits, hits, uncomputed - chunk)
        return Outcome.SCHEDULED

    def advance(self, group: GroupView, max_tokens: int | None = None) -> Outcome:
        """Run a running group: one decode token per sequence, or the next chunk of its prefill."""
        g = self._resolve(group, _RUNNING, "advance")
        outcome = self._run(g, max_tokens, "advance")
        if outcome is Outcome.SCHEDULED:
            self._touched[g] = "scheduled"
        return outcome

    def swap_in(self, group: GroupView, max_tokens: int | None = None) -> Outcome:
        """Bring a swapped group back to the GPU and run it in this step.

        A group swapped out in the middle of a chunked prefill continues with a chunk of at most
        ``max_tokens`` tokens.
        """
        g = self._resolve(group, _SWAPPED, "swap_in")
        status = self._bm.can_swap_in(g)
        if status is AllocStatus.NEVER:
            return self._ignore(g, "swapped group can never fit back in the GPU KV cache")
        if status is AllocStatus.LATER:
            return self._no_blocks(g, self._bm.blocks_to_swap_in(g))
        uncomputed = g.num_uncomputed_tokens
        chunk = self._chunk(g, uncomputed, max_tokens, "swap_in") if uncomputed > g.num_unfinished_seqs else uncomputed
        if self._over_budget(g, chunk):
            return Outcome.BUDGET
        moved = self._bm.swap_in(g)
        self.output.blocks_to_swap_in += moved
        self._note(None, Decision.SWAPPED_IN, g.request_id, len(moved))
        self._touched[g] = "swapped in"
        self.swapped_in.append(g)
        self.num_running_seqs += g.max_running_seqs
        # can_swap_in kept one spare block per sequence, so the decode below never preempts.
        return self._run(g, max_tokens, "swap_in")

    def preempt(self, group: GroupView, mode: PreemptionMode | None = None) -> PreemptionMode:
        """Evict a running group now; returns the mode actually used."""
        g = self._resolve(group, _RUNNING, "preempt")
        return self._preempt(g, mode)

    def advance_running(self, stop_on_preempted: bool = True) -> Outcome:
        """``advance`` every running group not yet touched, oldest first: the loop most policies write, run in the core.

        Stops at the first group that exceeds the token budget (returns BUDGET) and, unless
        ``stop_on_preempted`` is False, at the first group that is itself preempted to make room
        (returns PREEMPTED, where vLLM's running loop ends); otherwise returns SCHEDULED. Groups
        preempted on the way to make room for an older one are skipped, as a loop over
        ``running`` that checks ``was_touched`` would.
        """
        if self._lane_step(decodes_only=False, max_tokens=None):
            return Outcome.SCHEDULED
        touched = self._touched
        for g in self._sched.running:
            if g in touched:
                continue
            outcome = self._run(g, None, "advance")
            if outcome is Outcome.SCHEDULED:
                touched[g] = "scheduled"
            elif outcome is Outcome.BUDGET or stop_on_preempted:
                return outcome
        return Outcome.SCHEDULED

    def advance_decodes(self, max_tokens: int | None = None) -> Outcome:
        """``advance`` every running group that is decoding, oldest first; groups in the middle of
        a prefill are left untouched (Sarathi-Serve's "decodes first").

        Stops (returns BUDGET) at the first decode whose tokens do not fit in what is left of
        ``max_tokens`` (a cap on the tokens of this call; None: no cap; 0 or less: nothing fits)
        or of the step's token budget. A group preempted to make room, itself included, is
        passed over.
        """
        if self._lane_step(decodes_only=True, max_tokens=max_tokens):
            return Outcome.SCHEDULED
        touched, out = self._touched, self.output
        left = self._max_tokens if max_tokens is None else max_tokens
        for g in self._sched.running:
            if g in touched or g.num_uncomputed_tokens > g.num_unfinished_seqs:
                continue
            before = out.num_batched_tokens
            if g.num_uncomputed_tokens > left:
                return self._no_tokens(g, g.num_uncomputed_tokens, left)
            outcome = self._run(g, None, "advance")
            if outcome is Outcome.SCHEDULED:
                touched[g] = "scheduled"
                left -= out.num_batched_tokens - before
            elif outcome is Outcome.BUDGET:
                return outcome
        return Outcome.SCHEDULED

    def _lane_step(self, decodes_only: bool, max_tokens: int | None) -> bool:
        """Schedule this call's decodes through the decode lane if it is exact now; else make sure
        no member is left in the lane, since the loop that follows advances them one by one."""
        lane = self._sched.lane
        if lane is None or lane.scheduled:  # a second call: the lane's members are all touched already
            return False
        out = self.output
        if not (out.scheduled or out.preempted) and lane.schedule(self._sched.running, out, self._max_tokens, self._touched, decodes_only, max_tokens):
            out.lane_decodes = lane.scheduled
            return True
        lane.dissolve()
        return False

    # -------------------------------------------------------------------------- mechanics
    def _run(self, g: SequenceGroup, max_tokens: int | None, op: str) -> Outcome:
        seqs = g.seqs
        if len(seqs) == 1:
            seq = seqs[0]
            if seq.num_tokens - seq.num_computed_tokens == 1:
                return self._decode_one(g, seq)
        out = self.output
        uncomputed = g.num_uncomputed_tokens
        is_prefill = uncomputed > g.num_unfinished_seqs
        chunk = self._chunk(g, uncomputed, max_tokens, op) if is_prefill else uncomputed
        if out.num_batched_tokens + chunk > self._max_tokens:
            return self._no_tokens(g, chunk, self._max_tokens - out.num_batched_tokens)
        running = [s for s in seqs if s.status <= _SWAPPED]
        if not is_prefill:
            if self._make_room(g):
                return Outcome.PREEMPTED
            for seq in running:
                cow = self._bm.append_slots(seq)
                if cow is not None:
                    out.blocks_to_copy.append(cow)
        self._record(g, chunk, is_prefill, sum(s.num_computed_tokens for s in running), 0, uncomputed - chunk)
        return Outcome.SCHEDULED

    def _decode_one(self, g: SequenceGroup, seq: Sequence) -> Outcome:
        """``_run`` for the commonest case, one sequence decoding one token (once per running request per step)."""
        out = self.output
        if out.num_batched_tokens >= self._max_tokens:
            return self._no_tokens(g, 1, self._max_tokens - out.num_batched_tokens)
        if self._bm.gpu.num_free < 1 and self._make_room(g):
            return Outcome.PREEMPTED
        cow = self._bm.append_slots(seq)
        if cow is not None:
            out.blocks_to_copy.append(cow)
        out.scheduled.append(ScheduledGroup(g, 1, False))  # _record(g, 1, False, computed), inlined
        out.num_batched_tokens += 1
        out.decode_seqs += 1
        out.kv_tokens_read += seq.num_computed_tokens
        return Outcome.SCHEDULED

    def _make_room(self, g: SequenceGroup) -> bool:
        """Preempt until every unfinished sequence of ``g`` could take a new block (vLLM's worst case).

        Returns True if ``g`` itself had to go, False once it can decode.
        """
        bm = self._bm
        while bm.gpu.num_free < g.num_unfinished_seqs:  # bm.can_append_slots, inlined: the hot path
            victim, mode = self._choose_victim(g)
            if victim is g:
                # Deliberate difference from vLLM: do not preempt the last candidate when its
                # exact need fits (vLLM's worst case makes a lone request thrash).
                if bm.blocks_to_append(g) <= bm.gpu.num_free:
                    return False
                self._preempt(g, mode, g)
                return True
            self._preempt(victim, mode, g)
        return False

    def _record(self, g: SequenceGroup, chunk: int, is_prefill: bool, context: int, cached: int = 0, left: int = 0) -> None:
        """Add ``g`` to the batch and to the step's cost features (``context``: KV tokens it reads;
        ``cached``: prompt tokens an admission found in the prefix cache; ``left``: prompt tokens a
        prefill leaves for later chunks)."""
        out = self.output
        out.scheduled.append(ScheduledGroup(g, chunk, is_prefill, cached))
        out.num_batched_tokens += chunk
        if is_prefill:
            out.prefill_tokens += chunk
            out.decisions.append((Decision.PREFILL, g.request_id, chunk, left, cached))
        else:
            out.decode_seqs += chunk
        out.kv_tokens_read += context

    def _choose_victim(self, requester: SequenceGroup) -> tuple[SequenceGroup, PreemptionMode | None]:
        choice = self._hooks.choose_preemption(step=self, requester=requester.view)
        if choice is None:
            fallback = self.newest_unscheduled(exclude=requester.view)
            choice = Preemption(fallback if fallback is not None else requester.view)
        if not isinstance(choice, Preemption) or not isinstance(choice.victim, GroupView):
            raise PolicyError(self.policy_name, f"choose_preemption returned {choice!r}, expected a Preemption")
        victim = choice.victim._group
        if victim is not requester:
            if victim.status is not _RUNNING or victim in self._touched:
                state = self._touched.get(victim, victim.status.name)
                raise PolicyError(self.policy_name, f"choose_preemption picked {victim.request_id!r}, which is {state}, not an unscheduled running group")
        return victim, choice.mode

    def _preempt(self, g: SequenceGroup, mode: PreemptionMode | None, requester: SequenceGroup | None = None) -> PreemptionMode:
        _out_of_lane(g)
        if self.config.preemption_mode is not None:
            mode = self.config.preemption_mode
        elif mode is None:
            mode = PreemptionMode.RECOMPUTE if g.max_running_seqs == 1 else PreemptionMode.SWAP
        if mode is PreemptionMode.SWAP and not self._bm.can_swap_out(g):
            mode = PreemptionMode.RECOMPUTE  # the CPU pool is full: recompute instead of failing
        if mode is PreemptionMode.SWAP:
            self.output.blocks_to_swap_out += self._bm.swap_out(g)
            self.swapped_out.append(g)
        else:
            for seq in g.seqs:
                self._bm.free(seq)
            self.recomputed.append(g)
        self._touched[g] = f"preempted ({mode.value})"
        self.output.preempted.append((g, mode))
        self._note(None, Decision.PREEMPTED, g.request_id, mode, requester.request_id if requester is not None else None)
        self.num_running_seqs -= g.max_running_seqs
        return mode

    def _chunk(self, g: SequenceGroup, uncomputed: int, max_tokens: int | None, op: str) -> int:
        if max_tokens is None or max_tokens >= uncomputed:
            return uncomputed
        if max_tokens < 1:
            raise PolicyError(self.policy_name, f"{op}: max_tokens must be at least 1, got {max_tokens}")
        if g.num_unfinished_seqs > 1:
            raise PolicyError(self.policy_name, f"{op}: chunked prefill of {g.request_id!r} with several sequences is not supported")
        return max_tokens

    def _ignore(self, g: SequenceGroup, reason: str) -> Outcome:
        self._touched[g] = "ignored"
        self.ignore_reasons[g] = reason
        self.output.ignored.append(g)
        self._note(None, Decision.IGNORED, g.request_id, reason)
        return Outcome.NEVER

    def _resolve(self, view: GroupView, expected: SequenceStatus, op: str) -> SequenceGroup:
        if not isinstance(view, GroupView):
            raise PolicyError(self.policy_name, f"{op}: expected a GroupView, got {type(view).__name__}")
        g = view._group
        state = self._touched.get(g)
        if state is not None:
            raise PolicyError(self.policy_name, f"{op}: {g.request_id!r} was already {state} in this step")
        if g.status is not expected:
            raise PolicyError(self.policy_name, f"{op}: {g.request_id!r} is {g.status.name}, not {expected.name}")
        _out_of_lane(g)  # it may change on its own now
        return g


def _out_of_lane(g: SequenceGroup) -> None:
    """Dissolve the decode lane if ``g`` rides it (members change only together)."""
    lane = g.seqs[0].lane
    if lane is not None:
        lane.dissolve()
