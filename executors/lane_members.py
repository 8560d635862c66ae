"""A decode lane's members: a sequence and its group while they ride the lane (``decode_lane.py``).

The lane switches a member's class on joining and back on leaving, so that only members pay for
properties: their token counts add the lane's steps since they joined, and reading ``output``
writes the pending tokens out, so nothing read is ever stale.
"""

from __future__ import annotations

from kvsched.core.sequence import Sequence, SequenceGroup

# The plain classes' slots, read past the properties below.
_TOKENS, _COMPUTED, _OUTPUT = Sequence.num_tokens, Sequence.num_computed_tokens, Sequence.output
_GENERATED = SequenceGroup.num_generated_tokens


class LaneSequence(Sequence):
    """A sequence while it rides a decode lane: the same object, its class switched on joining and
    leaving, so that only members pay for properties. Its counts add the lane's steps since
    ``lane_mark``; reading ``output`` writes the pending tokens out. Setting ``num_computed_tokens``
    or appending a token dissolves the lane first (the engine does neither to a member)."""

    __slots__ = ()

    @property
    def num_tokens(self) -> int:
        return _TOKENS.__get__(self) + self.lane.steps - self.lane_mark

    @property
    def num_computed_tokens(self) -> int:
        return _COMPUTED.__get__(self) + self.lane.steps - self.lane_mark

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        self.lane.dissolve()
        self.num_computed_tokens = value  # a plain Sequence again

    @property
    def output(self) -> list[int]:
        self.lane.sync(self)
        return _OUTPUT.__get__(self)

    def append_token(self, token: int) -> None:
        self.lane.dissolve()
        self.append_token(token)


class LaneGroup(SequenceGroup):
    """The group of a ``LaneSequence`` (switched with it): its generated-token count includes the lane's."""

    __slots__ = ()

    @property
    def num_generated_tokens(self) -> int:
        seq = self.seqs[0]
        return _GENERATED.__get__(self) + seq.lane.steps - seq.lane_mark

    @num_generated_tokens.setter
    def num_generated_tokens(self, value: int) -> None:
        self.seqs[0].lane.dissolve()
        self.num_generated_tokens = value
