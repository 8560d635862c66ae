"""The engine's state for a request: its sequences, their tokens and where they are."""

from __future__ import annotations

import functools
from enum import IntEnum
from typing import TYPE_CHECKING

from kvsched.core.view import GroupView, view_of

if TYPE_CHECKING:
    from kvsched.core.request import Request


class SequenceStatus(IntEnum):
    """vLLM's sequence states; those above SWAPPED are final."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6

    @property
    def is_finished(self) -> bool:
        return self > SequenceStatus.SWAPPED

    @property
    def finish_reason(self) -> str | None:
        """OpenAI's: stop, length (ignored prompts too, as in vLLM) or abort."""
        return _FINISH_REASONS.get(self)


_LAST_ACTIVE = SequenceStatus.SWAPPED  # hot paths compare ``status > _LAST_ACTIVE`` (a C-level int compare)


@functools.lru_cache(maxsize=1024)
def _stop_set(stop_token_ids: tuple[int, ...], eos_token_id: int | None) -> frozenset[int]:
    return frozenset(stop_token_ids if eos_token_id is None else (*stop_token_ids, eos_token_id))


_FINISH_REASONS = {
    SequenceStatus.FINISHED_STOPPED: "stop",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
    SequenceStatus.FINISHED_ABORTED: "abort",
    SequenceStatus.FINISHED_IGNORED: "length",
}


class Sequence:
    """One output sequence: the shared prompt plus its own generated tokens. ``num_computed_tokens`` have their KV in
    the cache; a step computes (some of) the rest, and the sequence samples a token once none is left."""

    __slots__ = (
        "seq_id",
        "group",
        "prompt",
        "output",
        "num_tokens",
        "status",
        "num_computed_tokens",
        "lane",
        "lane_mark",
    )

    def __init__(self, seq_id: int, group: SequenceGroup, prompt, output: list[int] | None = None) -> None:
        self.seq_id = seq_id
        self.group = group
        self.prompt = prompt
        self.output: list[int] = output if output is not None else []
        self.num_tokens = len(prompt) + len(self.output)  # kept, not derived: read on every step
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.lane = None  # the decode lane it rides, if any (executors/decode_lane.py; a LaneSequence then)

    def append_token(self, token: int) -> None:
        self.output.append(token)
        self.num_tokens += 1

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def token_slice(self, start: int, stop: int) -> tuple[int, ...]:
        """Token ids ``[start, stop)`` across the prompt/output boundary."""
        p = len(self.prompt)
        if stop <= p:
            return tuple(self.prompt[start:stop])
        if start >= p:
            return tuple(self.output[start - p : stop - p])
        return tuple(self.prompt[start:]) + tuple(self.output[: stop - p])

    def __repr__(self) -> str:
        status = self.status.name
        return f"Sequence({self.seq_id}, {status}, tokens={self.num_tokens}, computed={self.num_computed_tokens})"


class SequenceGroup:
    """A request and its ``n`` sequences, scheduled together; ``status`` is its queue or its final state. It starts as
    one sequence, forked after the prompt step to share the prompt's blocks copy-on-write."""

    __slots__ = (
        "request",
        "request_id",
        "index",
        "n",
        "seqs",
        "status",
        "finish_detail",
        "view",
        "arrival_time",
        "last_queued_time",
        "first_scheduled_time",
        "first_token_time",
        "finish_time",
        "num_recompute_preemptions",
        "num_swap_preemptions",
        "num_generated_tokens",
        "num_unfinished_seqs",
        "stop_tokens",
        "max_seq_tokens",
        "block_manager",
        "refused",
        "grammar_ready_at",
        "num_discarded_tokens",
        "num_recomputed_tokens",
        "num_prefix_hit_tokens",
        "recompute_frontier",
        "life_start",
        "request_copy",
        "__weakref__",  # for its view (core/view.py)
    )

    def __init__(
        self,
        request: Request,
        index: int,
        first_seq_id: int,
        eos_token_id: int | None = None,
        max_seq_len: int | None = None,
    ) -> None:
        self.request = request
        self.request_id = request.request_id
        self.index = index
        self.n = request.sampling.n
        # A prompt given only by length gets ids unique to this request, so no accidental prefix hits.
        prompt = request.prompt_token_ids or range((index + 1) << 32, ((index + 1) << 32) + request.prompt_len)
        self.seqs = [Sequence(first_seq_id, self, prompt)]
        self.status = SequenceStatus.WAITING
        self.finish_detail: str | None = None
        self.arrival_time = self.last_queued_time = request.arrival_time
        # When its structured-output grammar is compiled, if it has one (inside vLLM, the mirror learns it).
        compile_s = request.grammar_compile_s
        self.grammar_ready_at = None if compile_s is None else request.arrival_time + compile_s
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.num_recompute_preemptions = 0
        self.num_swap_preemptions = 0
        # The recompute tax (metrics/recompute.py; note_admission, note_recompute), counted over its sequences.
        self.num_discarded_tokens = self.num_recomputed_tokens = self.num_prefix_hit_tokens = 0
        self.recompute_frontier = self.life_start = 0
        self.num_generated_tokens = 0
        self.num_unfinished_seqs = 1  # kept by the engine as sequences fork and finish
        self.request_copy = None  # the request as hooks read it (core.view.frozen), made on first read
        self.view: GroupView = view_of(self)
        # What ends a sequence: a stop token, or ``max_seq_tokens`` (the engine's EOS and limit may be None: none).
        params = request.sampling
        eos = None if params.ignore_eos else eos_token_id
        self.stop_tokens = _stop_set(params.stop_token_ids, eos)
        limit = len(prompt) + params.max_tokens
        self.max_seq_tokens = limit if max_seq_len is None else min(limit, max_seq_len)
        self.block_manager = None  # its engine's: only that engine's operations take it
        self.refused: int | None = None  # the blocks its last admission lacked, if counted (StepState.admit)

    def unfinished_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if s.status <= _LAST_ACTIVE]

    def waiting_seqs(self) -> list[Sequence]:
        seqs = self.seqs
        if len(seqs) == 1:  # the common case, asked several times per admission
            return [seqs[0]] if seqs[0].status is SequenceStatus.WAITING else []
        return [s for s in seqs if s.status is SequenceStatus.WAITING]

    @property
    def max_running_seqs(self) -> int:
        """Sequences this group will run at once: ``n`` before the fork, then the unfinished ones."""
        return self.num_unfinished_seqs if self.n == 1 or len(self.seqs) > 1 else self.n

    @property
    def num_uncomputed_tokens(self) -> int:
        seqs = self.seqs
        if len(seqs) == 1:
            s = seqs[0]
            return s.num_tokens - s.num_computed_tokens if s.status <= _LAST_ACTIVE else 0
        return sum(s.num_tokens - s.num_computed_tokens for s in seqs if s.status <= _LAST_ACTIVE)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def note_admission(self, cached: int) -> None:
        """Admitted with ``cached`` tokens in the prefix cache: all it had computed beyond them is computed again."""
        self.num_prefix_hit_tokens += cached
        self.life_start = cached
        if self.recompute_frontier > cached:
            self.num_recomputed_tokens += self.recompute_frontier - cached

    def note_recompute(self, computed: int) -> None:
        """Preempted by recompute, throwing away ``computed`` tokens of KV."""
        self.num_discarded_tokens += computed
        if computed < self.recompute_frontier:  # preempted again before it had recomputed all it had lost
            self.num_recomputed_tokens -= self.recompute_frontier - max(computed, self.life_start)
        self.recompute_frontier = max(self.recompute_frontier, computed)

    def __repr__(self) -> str:
        return f"SequenceGroup({self.request_id!r}, {self.status.name}, seqs={len(self.seqs)})"
