"""``n > 1`` under V1's mechanics: as V1's front end does (``parallel_sampling.ParentRequest``), a request fans out
into ``n`` child requests ``"{i}_{request_id}"`` with ``n = 1``, each scheduled on its own. The engine reports the
parent (one request with ``n`` outputs, as in v0), done when its last child is."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.core.sequence import SequenceGroup

if TYPE_CHECKING:
    from kvsched.core.engine import Engine


class FanOut:
    """The parents of fanned-out requests and their children (``parent_of``: child group -> parent group)."""

    __slots__ = ("engine", "parent_of", "children")

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.parent_of: dict[SequenceGroup, SequenceGroup] = {}
        self.children: dict[SequenceGroup, list[SequenceGroup]] = {}

    def add(self, parent: SequenceGroup) -> None:
        """Queue ``parent``'s children (``seed + i`` when seeded); the parent's sequences become theirs. A child keeps
        the parent's index: a prompt given by length has the same tokens in each, and results keep its place."""
        request, engine = parent.request, self.engine
        params = request.sampling
        eos, max_seq_len = engine.executor.eos_token_id, engine.max_seq_len
        children = []
        for i in range(parent.n):
            sampling = params.model_copy(update={"n": 1, "seed": None if params.seed is None else params.seed + i})
            child_request = request.model_copy(update={"request_id": f"{i}_{request.request_id}", "sampling": sampling})
            child = SequenceGroup(child_request, parent.index, engine.new_seq_id(), eos, max_seq_len)
            self.parent_of[child] = parent
            children.append(child)
            engine.scheduler.add(child)
        self.children[parent] = children
        parent.seqs = [c.seqs[0] for c in children]
        parent.num_unfinished_seqs = parent.n

    def members(self, group: SequenceGroup) -> list[SequenceGroup]:
        """What ending ``group`` ends: its unfinished children if it fanned out, else itself."""
        children = self.children.get(group)
        return [group] if children is None else [c for c in children if not c.is_finished]

    def ended(self, groups: list[SequenceGroup]) -> list[SequenceGroup]:
        """``groups`` (ended in one step) as reported: a child by its parent, once the last one ended."""
        if not self.parent_of:
            return groups
        reported = []
        for g in groups:
            parent = self.parent_of.pop(g, None)
            if parent is None:
                reported.append(g)
                continue
            parent.num_unfinished_seqs -= 1
            if parent.num_unfinished_seqs == 0:
                self._close(parent)
                reported.append(parent)
        return reported

    def _close(self, parent: SequenceGroup) -> None:
        """The parent's results from its children's: the earliest start, the last finish, counts summed."""
        children = self.children.pop(parent)
        started = [c.first_scheduled_time for c in children if c.first_scheduled_time is not None]
        first = [c.first_token_time for c in children if c.first_token_time is not None]
        parent.first_scheduled_time = min(started) if started else None
        parent.first_token_time = min(first) if first else None
        parent.finish_time = max(c.finish_time for c in children)
        parent.num_generated_tokens = sum(c.num_generated_tokens for c in children)
        parent.num_recompute_preemptions = sum(c.num_recompute_preemptions for c in children)
        parent.num_swap_preemptions = sum(c.num_swap_preemptions for c in children)
        parent.status = max(c.status for c in children)
        parent.finish_detail = next((c.finish_detail for c in children if c.finish_detail is not None), None)
