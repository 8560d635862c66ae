"""What the block manager reads of the engine's sequences and groups: two small protocols, so that
the allocators import nothing of the engine (the core's ``Sequence`` and ``SequenceGroup`` satisfy them)."""

from __future__ import annotations

from collections.abc import Sequence as Tokens
from typing import Protocol


class Sequence(Protocol):
    """What the block manager reads of a sequence: its id and its tokens."""

    seq_id: int
    num_tokens: int
    num_computed_tokens: int
    prompt: Tokens[int]
    output: Tokens[int]

    def token_slice(self, start: int, stop: int) -> tuple[int, ...]: ...


class SequenceGroup(Protocol):
    """What it reads of a group: its sequences, and which of them wait or are unfinished."""

    seqs: list[Sequence]
    num_unfinished_seqs: int

    def waiting_seqs(self) -> list[Sequence]: ...

    def unfinished_seqs(self) -> list[Sequence]: ...
