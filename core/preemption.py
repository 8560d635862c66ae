"""How a step preempts (a mixin of ``StepState``): the policy's victim checked, the mode settled, its blocks freed or
swapped out at once, so that the next operation sees the room."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.core.config import PreemptionMode
from kvsched.core.decisions import Decision, Preempted, Preemption, held_problem
from kvsched.core.outputs import Victim
from kvsched.core.sequence import SequenceStatus
from kvsched.core.view import GroupView, group_of
from kvsched.errors import quote

if TYPE_CHECKING:
    from kvsched.core.sequence import SequenceGroup


class Preemptions:
    victim_states = (None,)  # what a victim may have been in this step: untouched (V1 adds "scheduled")

    def make_room(self, g: SequenceGroup) -> bool:
        """Preempt until each unfinished sequence of ``g`` can take a block (vLLM's worst case); True if ``g`` went."""
        bm = self.bm
        while bm.gpu.num_free < g.num_unfinished_seqs:  # bm.can_append_slots, inlined: the hot path
            victim, mode, reason = self.choose_victim(g)
            if victim is g:
                # Unlike vLLM, the last candidate stays when its exact need fits (the worst case makes it thrash).
                if bm.blocks_to_append(g) <= bm.gpu.num_free:
                    return False
                self.preempt_group(g, mode, g, reason)
                return True
            self.preempt_group(victim, mode, g, reason)
        return False

    def choose_victim(self, requester: SequenceGroup) -> tuple[SequenceGroup, PreemptionMode | None, str | None]:
        hook = "choose_preemption"
        choice = self.hooks.choose_preemption(self.step, requester.view)
        if type(choice) is not Preemption or type(choice.victim) is not GroupView:
            self.refuse(f"returned {quote(choice)}, expected a Preemption of a GroupView", hook)
        if choice.reason is not None and held_problem(choice.reason, {}):
            self.refuse(
                f"gave the reason {quote(choice.reason)}: a Preemption's reason is a line of text or None", hook
            )
        victim = group_of(choice.victim)
        if victim is not requester:
            if victim.block_manager is not self.bm:
                self.refuse(f"picked {quote(choice.victim)}, which is not a request of this engine", hook)
            if victim.status is not SequenceStatus.RUNNING or self.touched.get(victim) not in self.victim_states:
                state = self.touched.get(victim, victim.status.name)
                self.refuse(
                    f"picked {quote(victim.request_id)}, which is {state}, not an unscheduled running group", hook
                )
        return victim, self._mode_arg(choice.mode, "Preemption", hook), choice.reason

    def preempt_group(
        self, g: SequenceGroup, mode: PreemptionMode | None, requester: SequenceGroup | None = None, reason=None
    ) -> PreemptionMode:
        if (fast := self.sched.fast_path) is not None:  # its decode lane, if it rides one, dissolves
            fast.touch(g)
        if self.forced_mode is not None:  # the config's, else the policy's, else recompute one sequence, swap several
            mode = self.forced_mode
        elif mode is None:
            mode = PreemptionMode.RECOMPUTE if g.max_running_seqs == 1 else PreemptionMode.SWAP
        if mode is PreemptionMode.SWAP and not self.bm.can_swap_out(g):
            mode = PreemptionMode.RECOMPUTE  # the CPU pool is full: recompute instead of failing
        requested = requester.request_id if requester is not None else None
        self.output.decisions.append(Preempted(Decision.PREEMPTED, g.request_id, mode, requested, reason))
        if mode is PreemptionMode.SWAP:
            self.output.blocks_to_swap_out += self.bm.swap_out(g)
            self.swapped_out.append(g)
        else:
            for seq in g.seqs:
                self.bm.free(seq)
            self.recomputed.append(g)
        self.touched[g] = f"preempted ({mode.value})"
        self.output.preempted.append(Victim(g, mode))
        self.num_running_seqs -= g.max_running_seqs
        return mode
