"""The step builder under vLLM V1's mechanics (``EngineConfig(vllm_engine="v1")``): the same operations and checks,
with KV blocks taken as vLLM 0.32's ``KVCacheManager.allocate_slots`` takes them (chunk by chunk, exactly, named in
the prefix cache as allocated; preemption recomputes). docs/vllm-v1.md sets each rule beside vLLM's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.core.config import PreemptionMode
from kvsched.core.decisions import Decision, Outcome
from kvsched.core.outputs import ScheduledGroup
from kvsched.core.sequence import SequenceStatus
from kvsched.core.step_state import StepState
from kvsched.core.view import GroupView, group_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvsched.allocators.offloading import Load
    from kvsched.core.plugins import PolicyHooks
    from kvsched.core.scheduler import Scheduler
    from kvsched.core.sequence import Sequence, SequenceGroup


def grammar_ready(group: SequenceGroup | GroupView, now: float) -> bool:
    """V1 compiles a structured-output grammar in the background from arrival; the request waits for it."""
    ready_at = group.grammar_ready_at
    return ready_at is None or now >= ready_at


def remember_drafts(drafting: set[int], output, running: list[SequenceGroup]) -> None:
    """The sequences the drafter gives drafts for their next step (vLLM's ``update_draft_token_ids``): those sampled."""
    for sg in output.scheduled:
        seq = sg.group.seqs[0]  # one sequence: V1 fans n > 1 out
        if seq.num_computed_tokens + sg.num_tokens >= seq.num_tokens:
            drafting.add(seq.seq_id)
        else:
            drafting.discard(seq.seq_id)
    for victim in output.preempted:
        drafting.discard(victim.group.seqs[0].seq_id)
    if len(drafting) > 2 * len(running) + 64:  # finished or aborted ones: dropped now and then, not on every step
        drafting.intersection_update(g.seqs[0].seq_id for g in running)


class V1StepState(StepState):
    """One step under V1's block rules, each group one sequence (fanout.py); a policy sees no difference."""

    victim_states = (None, "scheduled")  # V1's priority rule may pick a victim scheduled earlier in the step

    def __init__(self, scheduler: Scheduler, now: float, hooks: PolicyHooks) -> None:
        super().__init__(scheduler, now, hooks)
        self.prompt_limit = self.config.model_len - 1
        self.caching = self.config.enable_prefix_caching
        self.drafts = self.config.num_speculative_tokens  # for each sequence in sched.drafting
        self.in_flight = scheduler.mechanics.in_flight
        self.forced_mode = PreemptionMode.RECOMPUTE  # V1 has no CPU swap

    def admit(self, group, max_tokens: int | None) -> Outcome:
        g = group_of(group) if type(group) is GroupView else None  # None: refused as the admission resolves it
        if g is not None and not grammar_ready(g, self.now):  # V1's WAITING_FOR_..._GRAMMAR
            self.resolve(group, SequenceStatus.WAITING, "admit")  # still this engine's waiting group, untouched
            return Outcome.LATER
        load = self._load(g) if self.sched.offloading is not None else None
        outcome = super().admit(group, max_tokens)
        if load is not None:  # kept and counted if admitted, else dropped
            scheduled = outcome is Outcome.SCHEDULED
            cached = self.output.scheduled[-1].num_cached_tokens if scheduled else None
            self.sched.offloading.admitted(load, cached, g.recompute_frontier)
            self.output.blocks_to_swap_in += load.moves if scheduled else ()
        if outcome is Outcome.SCHEDULED:
            entry = self.output.scheduled[-1]
            self.output.block_ops.append((g.request_id, upto := entry.num_cached_tokens + entry.num_tokens))
            if self.caching:  # the blocks its chunk fills are named as they are taken
                self.bm.mark_computed(g.seqs[0], upto)
        return outcome

    def _load(self, g: SequenceGroup | None) -> Load | None:
        """With a CPU tier: its blocks past the GPU hit, loaded before the admission looks the group up."""
        if g is None or g.block_manager is not self.bm or g in self.touched or g.status is not SequenceStatus.WAITING:
            return None
        if (
            self.output.num_batched_tokens >= self.max_tokens
            or self.num_running_seqs + g.max_running_seqs > self.max_seqs
            or self.bm.can_allocate(g) is not AllocStatus.OK
        ):  # vLLM loads nothing for an admission that fails
            return None
        return self.sched.offloading.load(g.request_id, g.seqs[0])

    def admitted_tokens(self, g: SequenceGroup, cached: dict[int, int], chunk: int) -> int | None:
        return cached[g.seqs[0].seq_id] + chunk

    def newest_unscheduled(self, exclude):
        newest = super().newest_unscheduled(None if self.in_flight else exclude)
        if self.in_flight and newest is not None and exclude is not None and newest.request_id == exclude.request_id:
            return None  # with a step in flight, the requester is its own victim
        return newest

    def run_group(self, g: SequenceGroup, max_tokens: int | None, op: str, room: bool = False) -> Outcome:
        seq = g.seqs[0]  # the only one: V1 fans n > 1 out
        if self.in_flight is not None and seq.num_tokens >= g.max_seq_tokens - 1 and self.in_flight(seq):
            return Outcome.LATER  # its in-flight step samples its last token: vLLM passes over it
        if seq.num_tokens - seq.num_computed_tokens == 1:
            if self.drafts and seq.seq_id in self.sched.drafting:
                return self._speculate(g, seq, max_tokens)
            return self.decode_one(g, seq, room)
        return super().run_group(g, max_tokens, op, room)

    def _speculate(self, g: SequenceGroup, seq: Sequence, max_tokens: int | None) -> Outcome:
        """A decode with as many of its ``1 + k`` draft tokens as the cap, the budget and ``max_model_len`` allow."""
        out = self.output
        left = self.max_tokens - out.num_batched_tokens
        if left <= 0:
            return self.no_tokens(g, 1, left)
        n = min(1 + self.drafts, left, self.config.model_len - seq.num_computed_tokens - 1)
        if max_tokens is not None and max_tokens < n:
            n = max_tokens
        if self.take_blocks(g, g.seqs, n, False):
            return Outcome.PREEMPTED
        out.scheduled.append(ScheduledGroup(g, n, False))
        out.num_batched_tokens += n
        out.decode_seqs += 1
        out.prefill_tokens += n - 1  # the drafts are verified in one pass, as prompt tokens are computed
        out.kv_tokens_read += seq.num_computed_tokens
        return Outcome.SCHEDULED

    def take_blocks(self, g: SequenceGroup, running: list[Sequence], chunk: int, room: bool) -> bool:
        """The one sequence's blocks grow to hold ``chunk`` more tokens (a prompt's, or a decode's and its drafts),
        of which the known ones are named in the prefix cache; True if ``g`` itself was preempted."""
        bm, seq = self.bm, running[0]
        target = seq.num_computed_tokens + chunk
        if self.make_room(g, lambda: bm.blocks_to_grow(seq, target)):
            return True
        bm.grow(seq, target)
        self._name(seq, min(target, seq.num_tokens))
        self.output.block_ops.append((g.request_id, target))
        return False

    def decode_one(self, g: SequenceGroup, seq: Sequence, room: bool = False) -> Outcome:
        out, bm = self.output, self.bm
        if out.num_batched_tokens >= self.max_tokens:
            return self.no_tokens(g, 1, self.max_tokens - out.num_batched_tokens)
        if seq.num_tokens > len(bm.gpu_tables[seq.seq_id]) * bm.block_size:  # its last block is full
            if self.make_room(g, lambda: 1):
                return Outcome.PREEMPTED
            bm.append_slots(seq)
        self._name(seq, seq.num_tokens)
        # Plain (request id, upto) pairs, not named tuples: a like-Vidur V1 replay builds 4M, and naming them cost 6 %.
        out.block_ops.append((g.request_id, seq.num_tokens))
        out.scheduled.append(ScheduledGroup(g, 1, False))
        out.num_batched_tokens += 1
        out.decode_seqs += 1
        out.kv_tokens_read += seq.num_computed_tokens
        return Outcome.SCHEDULED

    def make_room(self, g: SequenceGroup, needed: Callable[[], int]) -> bool:
        """Preempt until the blocks ``g`` needs now are free; True if ``g`` itself had to go."""
        while needed() > self.bm.gpu.num_free:
            victim, mode, reason = self.choose_victim(g)
            self.preempt_group(victim, mode, g, reason)
            if victim is g:
                return True
        return False

    def _name(self, seq: Sequence, num_tokens: int) -> None:
        if self.caching:
            if self.in_flight is not None:  # tokens in flight are not known yet
                num_tokens = min(num_tokens, seq.num_tokens - self.in_flight(seq))
            self.bm.mark_computed(seq, num_tokens)

    def preempt_group(
        self, g: SequenceGroup, mode: PreemptionMode | None, requester: SequenceGroup | None = None, reason=None
    ) -> PreemptionMode:
        if self.touched.get(g) == "scheduled":
            self._unschedule(g)
        self.output.block_ops.append((g.request_id, None))
        return super().preempt_group(g, mode, requester, reason)

    def _unschedule(self, g: SequenceGroup) -> None:
        """A victim scheduled earlier in the step leaves the batch: its tokens and cost return (V1 copies no block)."""
        out = self.output
        entry = out.scheduled.pop(next(i for i, sg in enumerate(out.scheduled) if sg.group is g))
        out.num_batched_tokens -= entry.num_tokens
        out.kv_tokens_read -= g.seqs[0].num_computed_tokens
        if entry.is_prefill:  # the decision log must not say it prefilled: its note goes with it
            out.prefill_tokens -= entry.num_tokens
            notes, prefill = out.decisions, Decision.PREFILL
            del notes[max(i for i, n in enumerate(notes) if n.kind is prefill and n.request_id == g.request_id)]
        else:  # a decode, and its drafts, if any
            out.decode_seqs -= 1
            out.prefill_tokens -= entry.num_tokens - 1
        del self.touched[g]
