"""What one scheduler step hands to the executor."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, NamedTuple

from kvsched.core.sequence import SequenceStatus

if TYPE_CHECKING:
    from kvsched.core.config import PreemptionMode
    from kvsched.core.sequence import Sequence, SequenceGroup


class StepFeatures(NamedTuple):
    """What a step's time depends on (and a calibration regresses on): a named tuple, built once a step."""

    prefill_tokens: int  # P: prompt or chunk tokens computed
    decode_seqs: int  # D: sequences decoding one token
    kv_tokens_read: int  # K: cached context attended to (decode contexts + chunk prefixes)
    blocks_swapped: int
    blocks_copied: int
    prefill_pairs: int = 0  # E: query-key pairs attention computes for the chunks of two or more tokens


def causal_pairs(context: int, chunk: int) -> int:
    """Query-key pairs of ``chunk`` tokens after ``context``: query i (from 1) sees ``context + i`` keys."""
    return chunk * context + chunk * (chunk + 1) // 2


class Victim(NamedTuple):
    """A group the step preempted, and how (``OutputView.preempted`` gives the group's ``GroupView``)."""

    group: SequenceGroup
    mode: PreemptionMode


class ScheduledGroup:
    """A group that runs in this step and the tokens it computes, in all (only a single sequence may compute a chunk
    of its prefill); ``num_cached_tokens``: an admitted prompt's leading tokens found in the prefix cache."""

    __slots__ = ("group", "num_tokens", "is_prefill", "num_cached_tokens", "_chunks")

    def __init__(self, group: SequenceGroup, num_tokens: int, is_prefill: bool, num_cached_tokens: int = 0) -> None:
        self.group = group
        self.num_tokens = num_tokens
        self.is_prefill = is_prefill
        self.num_cached_tokens = num_cached_tokens
        self._chunks: list[tuple[Sequence, int]] | None = None

    def seq_chunks(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens it computes now) for each unfinished sequence, fixed at the first call (before the
        engine applies the step)."""
        chunks = self._chunks
        if chunks is None:
            seqs = self.group.seqs
            if len(seqs) > 1:
                seqs = [s for s in seqs if s.status <= SequenceStatus.SWAPPED]
            if len(seqs) == 1:
                chunks = [(seqs[0], self.num_tokens)]
            else:
                chunks = [(s, s.num_tokens - s.num_computed_tokens) for s in seqs]
            self._chunks = chunks
        return chunks

    def samples(self) -> list[tuple[Sequence, int]]:
        """(sequence, tokens to sample) for each sequence that finishes computing in this step: ``n`` for the prompt of
        a group not yet forked (the engine forks a sequence per extra token), else one. Call it before the step
        applies; a decode with drafts samples too (one token rejects every draft, 1 + a accepts a of them)."""
        samples = self.group.n if len(self.group.seqs) == 1 else 1  # one sequence: unforked, or n is 1
        return [(seq, samples) for seq, n in self.seq_chunks() if seq.num_computed_tokens + n >= seq.num_tokens]

    def __repr__(self) -> str:
        kind = "prefill" if self.is_prefill else "decode"
        return f"ScheduledGroup({self.group.request_id!r}, {kind}, tokens={self.num_tokens})"


@dataclass
class SchedulerOutput:
    """The step's batch plus the block movements an executor performs first, in this order: ``blocks_to_swap_out``
    (GPU→CPU), ``blocks_to_swap_in`` (CPU→GPU), ``blocks_to_copy`` (copy-on-write), then the model on ``scheduled``."""

    scheduled: list[ScheduledGroup] = field(default_factory=list)
    swapped_in: list[SequenceGroup] = field(default_factory=list)  # groups brought back from the CPU in this step
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Victim] = field(default_factory=list)
    ignored: list[SequenceGroup] = field(default_factory=list)
    num_batched_tokens: int = 0
    # The step's cost features, counted by the step builder as it schedules.
    prefill_tokens: int = 0
    decode_seqs: int = 0
    kv_tokens_read: int = 0
    # The first ``lane_decodes`` of ``scheduled`` ride the decode lane, their tokens known: ``KnownTokens`` skips them.
    lane_decodes: int = 0
    # Under V1: (request id, tokens its blocks now hold, or None when preempted) in the order taken, for the mirror.
    block_ops: list[tuple[str, int | None]] = field(default_factory=list)
    # Why, per decision that is not a plain decode (``core.decisions.Decision`` notes, in the order taken).
    decisions: list[tuple] = field(default_factory=list)

    def chunks(self) -> Iterator[tuple[int, int]]:
        """(context, tokens it computes) of each sequence outside the decode lane, as before the step applies."""
        for sg in islice(self.scheduled, self.lane_decodes, None):
            seqs = sg.group.seqs
            if len(seqs) == 1:  # most groups: its chunk is the group's, no chunk list made
                yield seqs[0].num_computed_tokens, sg.num_tokens
            else:
                yield from ((seq.num_computed_tokens, n) for seq, n in sg.seq_chunks())

    @property
    def num_prefill_groups(self) -> int:
        return sum(1 for s in islice(self.scheduled, self.lane_decodes, None) if s.is_prefill)  # lane entries decode

    _features: StepFeatures | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def features(self) -> StepFeatures:
        """What the step's cost depends on, counted as it was built, so that cost models and calibration agree
        (cached by hand: Python 3.11's ``cached_property`` takes a lock on every read)."""
        features = self._features
        if features is None:
            swapped = len(self.blocks_to_swap_in) + len(self.blocks_to_swap_out)
            pairs = 0
            for n, c in self.chunks() if self.prefill_tokens else ():
                if c > 1:
                    pairs += causal_pairs(n, c)
            counts = (self.prefill_tokens, self.decode_seqs, self.kv_tokens_read, swapped, len(self.blocks_to_copy))
            features = self._features = StepFeatures(*counts, pairs)
        return features

    @property
    def is_empty(self) -> bool:
        """Nothing for the executor to do (ignored groups need no execution, as in vLLM)."""
        return not (self.scheduled or self.blocks_to_swap_in or self.blocks_to_swap_out or self.blocks_to_copy)
