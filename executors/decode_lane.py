"""The decode lane: a batch of plain decodes advanced without per-sequence Python work each step.

Most of a simulated run is steps in which every running request decodes one token, and most of
the engine's time was the per-sequence work of those steps: a block check, a batch entry, a
token, a stop check, for every running sequence at every step. With an executor whose tokens
are known in advance (``KnownTokens``: the simulator), none of that has to happen per step:

- a member's token count is its stored count plus the lane's decode steps since it joined (a
  member is a ``LaneSequence``, whose counts add them on every read and whose ``output`` is
  written out when read, so nothing read is ever stale; a list object held from an earlier read
  is extended only at the next read);
- the step at which it needs its next KV block is known (every ``block_size`` tokens), so the
  block is appended exactly then, in its step, by the block manager as usual;
- the step at which it samples its last token is known (``first_stop`` or the length cap), so it
  leaves the lane exactly then and the engine finishes it as usual.

A lane step therefore costs the blocks that fall due and the requests that finish, plus two
C-level copies of the batch (its entries, reused from step to step, and the touched marks); a
change to the running queue costs one pass over it when the lane next runs. The lane is taken
only when it is exact: nothing of the running queue touched yet, every running group a
one-sequence decode past its first token (for ``advance_decodes``, or in the middle of a
prefill: passed over, and checked each step for the end of its prefill), the whole batch within
the token budget and the call's cap, and at
least one block to spare after the due ones (so that vLLM's worst-case check, which preempts once
no block is free, would have passed for every sequence). Otherwise the lane dissolves (each member
gets its tokens written out) and the step runs sequence by sequence. In a steady run
(``steady_runs.py``) the engine repeats a lane step without an output: ``coast`` takes such a
step whole when nobody finishes in it and a block is left to spare after the due ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kvsched.core.outputs import ScheduledGroup
from kvsched.core.sequence import Sequence, SequenceGroup, SequenceStatus
from kvsched.executors.lane_members import LaneGroup, LaneSequence

if TYPE_CHECKING:
    from kvsched.allocators.block_manager import BlockManager
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.step_state import StepState

_RUNNING = SequenceStatus.RUNNING


class Tokens(Protocol):
    """What the lane asks of its executor (``KnownTokens``), a promise: ``execute`` samples exactly ``tokens_at`` for a
    one-sequence group (an executor that changes the tokens must not offer a lane). Positions count output tokens
    from 1."""

    def tokens_at(self, group: SequenceGroup, start: int, stop: int) -> list[int]:
        """The tokens a one-sequence ``group`` samples at output positions ``start`` .. ``stop - 1``."""
        ...

    def first_stop(self, group: SequenceGroup, start: int) -> int | None:
        """The first position from ``start`` on whose token is in ``group.stop_tokens`` (None: never)."""
        ...


def _plain_decode(g: SequenceGroup) -> bool:
    """A running one-sequence decode past its first token (a prompt's last chunk samples a first token: timed per
    step)."""
    seqs = g.seqs
    return (
        len(seqs) == 1
        and g.n == 1
        and seqs[0].status is _RUNNING
        and seqs[0].num_uncomputed_tokens == 1
        and g.first_token_time is not None
    )


class DecodeLane:
    """The running one-sequence decodes of one engine, advanced together (see the module docstring)."""

    def __init__(self, block_manager: BlockManager, tokens: Tokens) -> None:
        self._bm = block_manager
        self._tokens = tokens
        self._block_size = block_manager.block_size
        self.steps = 0  # lane steps applied so far; a member is ``steps - lane_mark`` tokens ahead of its fields
        self._running: list[SequenceGroup] | None = None  # the running queue the batch below was built from
        self._decodes_only = False  # built for advance_decodes (groups in a prefill passed over)
        self._exact = False  # every group of that queue is a member, or passed over in a prefill
        self._passed_over: list[SequenceGroup] = []
        self._members: list[SequenceGroup] = []  # the members' groups, in running order
        self._batch: list[ScheduledGroup] = []  # one decode entry per member, in the same order
        self._touched: dict[SequenceGroup, str] = {}  # the same groups, as the step builder marks them
        self._entries: dict[SequenceGroup, ScheduledGroup] = {}
        self._position: dict[Sequence, int] = {}  # member -> a number that orders the members as the running queue does
        self._next_position = 0
        self._ends: dict[Sequence, int] = {}  # member -> lane step that samples its last token
        self._blocks_due: dict[int, list[Sequence]] = {}  # lane step -> members that need a block in it
        self._finishing: dict[int, list[Sequence]] = {}  # lane step -> members that end in it
        self.kv_tokens = 0  # sum of the members' computed tokens
        self.scheduled = 0  # members in the step being built (0: the step is not a lane step)
        self.call: tuple[bool, int | None, int] = (False, None, 0)  # the last taken: decodes only, cap, notes before

    # ----------------------------------------------------------------------------- scheduling
    def take(self, step: StepState, decodes_only: bool, cap: int | None) -> bool:
        """A step's ``advance_running`` (``advance_decodes`` with ``cap``, ``decodes_only``): schedule its decodes in
        the lane if it is exact now (noting the call in ``call``, for a repeat); else make sure no member
        is left in the lane, since the loop that follows advances them one by one."""
        if self.scheduled:  # a second call: the lane's members are all touched already
            return False
        out = step.output
        running, budget, touched = step.sched.running, step.max_tokens, step.touched
        if not (out.scheduled or out.preempted) and self.schedule(running, out, budget, touched, decodes_only, cap):
            out.lane_decodes = self.scheduled
            self.call = (decodes_only, cap, len(out.decisions))
            return True
        self.dissolve()
        return False

    def schedule(
        self,
        running: list[SequenceGroup],
        out: SchedulerOutput | None,
        max_tokens: int,
        touched: dict | None,
        decodes_only: bool = False,
        cap: int | None = None,
    ) -> bool:
        """Put every running group (``decodes_only``: every decoding one, passing over those in the
        middle of a prefill) in ``out`` as one decode, if the lane is exact for this step.
        ``cap`` bounds the decodes' tokens, as ``max_tokens`` bounds the step's."""
        if (
            running is not self._running
            or decodes_only != self._decodes_only
            or any(
                g.num_uncomputed_tokens <= g.num_unfinished_seqs
                for g in self._passed_over  # a prefill ended
            )
        ):
            self._follow(running, decodes_only)
        batch = self._batch
        n = len(batch)
        if (
            not self._exact
            or not n
            or (out.num_batched_tokens if out is not None else 0) + n > max_tokens
            or (cap is not None and n > cap)
        ):
            return False
        if not self._take_due():
            return False
        if out is not None:  # None: a step of a steady run (the engine advances it without an output)
            out.scheduled += batch
            out.num_batched_tokens += n
            out.decode_seqs += n
            out.kv_tokens_read += self.kv_tokens
        if touched is not None:  # None: nobody asks in this step
            touched.update(self._touched)
        self.scheduled = n
        return True

    def _take_due(self) -> bool:
        """Append the blocks that fall due in this lane step, if one is left to spare after them."""
        due = self._blocks_due.get(self.steps)
        if self._bm.gpu.num_free - (len(due) if due else 0) < 1:
            return False  # some sequence would meet vLLM's worst-case check with no free block
        if due is not None:
            del self._blocks_due[self.steps]
            ends, again = self._ends, self.steps + self._block_size
            if len(due) > 1:  # the sequence-by-sequence loop takes blocks in running order
                due.sort(key=self._position.__getitem__)
            self._bm.append_blocks(due)
            for seq in due:
                if again <= ends[seq]:
                    self._blocks_due.setdefault(again, []).append(seq)
        return True

    def _follow(self, running: list[SequenceGroup], decodes_only: bool) -> None:
        """Catch up with a changed running queue. Usually it holds the members in their order (some
        left), then groups appended since (admitted, swapped in), which join if they are plain
        decodes: the batch is updated in place. Anything else rebuilds it."""
        members = self._members
        m = len(members)
        if not (
            self._exact and decodes_only == self._decodes_only and not self._passed_over and running[:m] == members
        ):
            return self._rebuild(running, decodes_only)
        newcomers = running[m:]
        self._running = running
        if not newcomers:
            return
        self._exact = all(map(_plain_decode, newcomers)) and all([self._join(g, g.seqs[0]) for g in newcomers])
        if self._exact:  # else the lane dissolves before the step runs
            entries, position = self._entries, self._position
            members += newcomers
            self._batch += [entries[g] for g in newcomers]
            self._touched.update(dict.fromkeys(newcomers, "scheduled"))
            position.update(
                zip([g.seqs[0] for g in newcomers], range(self._next_position, self._next_position + len(newcomers)))
            )
            self._next_position += len(newcomers)

    def _rebuild(self, running: list[SequenceGroup], decodes_only: bool) -> None:
        """Take in the running groups that became plain decodes; note whether the lane is exact:
        every other running group is in the middle of a prefill, and passed over (``decodes_only``)."""
        self._running, self._decodes_only, self._exact, self._passed_over = running, decodes_only, False, []
        entries = self._entries
        newcomers, passed_over = [], []
        for g in running:  # none joins unless the lane can run: a lane that cannot is dissolved
            if g in entries:
                continue
            if _plain_decode(g):
                newcomers.append(g)
            elif decodes_only and g.num_uncomputed_tokens > g.num_unfinished_seqs:
                passed_over.append(g)
            else:
                return
        if all([self._join(g, g.seqs[0]) for g in newcomers]):
            self._exact = True
            self._passed_over = passed_over
            members = [g for g in running if g in entries] if passed_over else list(running)
            self._members = members
            self._batch = [entries[g] for g in members]
            self._touched = dict.fromkeys(members, "scheduled")
            # Members join out of running order when a group ahead of them was still in a prefill.
            self._position = {g.seqs[0]: i for i, g in enumerate(members)}
            self._next_position = len(members)

    def _join(self, g: SequenceGroup, seq: Sequence) -> bool:
        steps = self.steps
        num_tokens, num_output = seq.num_tokens, len(seq.output)
        last = g.max_seq_tokens - num_tokens  # lane steps until the length cap
        stop = self._tokens.first_stop(g, num_output + 1)
        if stop is not None:
            last = min(last, stop - num_output)
        if last < 1:
            return False
        end = steps + last - 1
        seq.lane, seq.lane_mark = self, steps
        seq.__class__, g.__class__ = LaneSequence, LaneGroup
        self._ends[seq] = end
        self._finishing.setdefault(end, []).append(seq)
        due = self._next_block_step(seq, num_tokens)
        if due <= end:
            self._blocks_due.setdefault(due, []).append(seq)
        self.kv_tokens += num_tokens - 1  # a plain decode has computed all but its newest token
        self._entries[g] = ScheduledGroup(g, 1, False)
        return True

    def _next_block_step(self, seq: Sequence, num_tokens: int) -> int:
        """The lane step that first finds ``seq``'s newest token beyond its last block (then one every
        ``block_size`` steps), given its ``num_tokens`` now."""
        return self.steps + max(0, len(self._bm.gpu_tables[seq.seq_id]) * self._block_size - num_tokens + 1)

    @property
    def batch(self) -> list[ScheduledGroup]:
        """The members' decode entries, in running order (a copy)."""
        return list(self._batch)

    # ------------------------------------------------------------------------------- applying
    def apply(self) -> list[Sequence]:
        """The lane step ran: every member is one token further. Returns the members that sampled
        their last token, out of the lane, with their tokens written out."""
        step, n = self.steps, self.scheduled
        self.steps = step + 1
        self.scheduled = 0
        self.kv_tokens += n
        ending = self._finishing.pop(step, None)
        if ending is None:
            return []
        if len(ending) > 1:  # the sequence-by-sequence engine finishes them in running order
            ending.sort(key=self._position.__getitem__)
        for seq in ending:
            self._leave(seq)
        return ending

    def coast(self) -> bool:
        """Take the next lane step of a steady run at once, if no member finishes in it and a block is
        left to spare after the due ones: the step ``schedule`` and ``apply`` would run, with nothing
        but its due blocks and the counts to change (the run's first step went through ``schedule``)."""
        step = self.steps
        if step in self._finishing or not self._take_due():
            return False
        self.steps = step + 1
        self.kv_tokens += len(self._batch)
        return True

    def audit(self, running: list[SequenceGroup]) -> list[str]:
        """Members that are not what the lane assumes (plain running decodes, blocks and end where predicted)."""
        problems = []
        in_running, size, steps = set(running), self._block_size, self.steps
        for seq, end in self._ends.items():
            name = f"lane member {seq.group.request_id}"
            if (
                seq.lane is not self
                or seq.group not in in_running
                or seq.status is not _RUNNING
                or seq.num_uncomputed_tokens != 1
            ):
                problems.append(f"{name} is not a running plain decode of this lane")
                continue
            capacity = len(self._bm.gpu_tables[seq.seq_id]) * size
            if capacity < seq.num_computed_tokens:
                problems.append(f"{name} has {seq.num_computed_tokens} computed tokens in {capacity} slots")
            due = self._next_block_step(seq, seq.num_tokens)
            if due <= end and seq not in self._blocks_due.get(due, ()):
                problems.append(f"{name} is not due for a block at lane step {due}")
            if end < steps or seq not in self._finishing.get(end, ()):
                problems.append(f"{name} is not due to finish at lane step {end}")
        if self._members and [g for g in running if g in self._entries] != self._members:
            problems.append("the lane's members are not in running order")
        kv = sum(seq.num_computed_tokens for seq in self._ends)
        if kv != self.kv_tokens:
            problems.append(f"lane counts {self.kv_tokens} computed tokens, its members hold {kv}")
        return problems

    # ------------------------------------------------------------------------- writing out
    def sync(self, seq: Sequence) -> None:
        """Write out the tokens ``seq`` decoded in the lane; it stays a member."""
        behind = self.steps - seq.lane_mark
        if behind:
            seq.lane_mark = self.steps
            group = seq.group
            seq.__class__, group.__class__ = Sequence, SequenceGroup
            output = seq.output
            output += self._tokens.tokens_at(group, len(output) + 1, len(output) + 1 + behind)
            seq.num_tokens += behind
            seq.num_computed_tokens += behind
            group.num_generated_tokens += behind
            seq.__class__, group.__class__ = LaneSequence, LaneGroup

    def _leave(self, seq: Sequence) -> None:
        """``seq`` finished: out of the lane, and out of the batch, which stays in running order."""
        self._unlink(seq)
        group = seq.group
        self.kv_tokens -= seq.num_computed_tokens
        del self._ends[seq]
        self._batch.remove(self._entries.pop(group))
        self._members.remove(group)
        del self._touched[group], self._position[seq]
        self._running = None  # the engine drops it from the running queue, a new list

    def _unlink(self, seq: Sequence) -> None:
        """Write out ``seq``'s tokens and make it a plain sequence again."""
        self.sync(seq)
        seq.__class__, seq.group.__class__ = Sequence, SequenceGroup
        seq.lane = None

    def rollback(self) -> None:
        """The step being built was abandoned: forget it and dissolve (its blocks went back with the block manager's
        rollback)."""
        self.scheduled = 0
        self.dissolve()

    def dissolve(self) -> None:
        """Every member leaves with its tokens written out; the next step rebuilds the lane."""
        if self.scheduled:
            raise RuntimeError("the decode lane cannot dissolve between scheduling a step and applying it")
        self._running, self._exact, self._passed_over = None, False, []
        if not self._ends:  # no member: the schedules below are empty too (each step without the lane comes here)
            return
        for seq in self._ends:
            self._unlink(seq)
        self._ends.clear()
        self._members, self._batch = [], []
        self._position.clear()
        self._entries.clear()
        self._blocks_due.clear()
        self._finishing.clear()
        self.kv_tokens = 0
