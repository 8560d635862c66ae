"""The simulated executor: no model, a virtual clock and a cost model; output lengths from requests."""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice

from kvsched.core.executor import StepResult
from kvsched.core.outputs import SchedulerOutput
from kvsched.core.sequence import SequenceGroup
from kvsched.executors.clocks import VirtualClock
from kvsched.executors.cost_model import DEFAULT_PROFILE, PROFILES, StepCost
from kvsched.executors.fast_path import FastPath

EOS = -1
IDLE_SECONDS = 1e-3  # time charged for a step that ran nothing, so time-based policies move on


class SimulatedExecutor:
    """Charges each step its cost-model time and emits placeholder tokens.

    A sequence emits EOS as its ``request.output_len``-th token (never, if ``output_len`` is None,
    so it runs to ``max_tokens``). Token ids are negative, so they never collide with a real
    vocabulary, and differ per sample so that forked sequences diverge.
    """

    eos_token_id = EOS

    def __init__(
        self, profile: str | StepCost = DEFAULT_PROFILE, block_size: int | None = None, *, steady_steps: bool = True
    ) -> None:
        if isinstance(profile, str):
            if profile not in PROFILES:
                raise KeyError(f"unknown cost profile {profile!r}; available: {', '.join(PROFILES)}")
            profile = PROFILES[profile]
        self.profile = profile
        self.block_size = block_size  # None: the engine's, taken at ``attach``
        # False: the policy is called even for a step the scheduler could repeat (docs/hooks.md; same results).
        self.steady_steps = steady_steps
        # Placeholder token of each output position, one shared int object per position, so a
        # million simulated requests keep pointers to the same few thousand ints, not new ones.
        self._placeholders: list[int] = []

    def attach(self, block_manager) -> None:
        """Take the engine's block size, which the cost of a swapped or copied block depends on."""
        if self.block_size is None:
            self.block_size = block_manager.block_size
        elif self.block_size != block_manager.block_size:
            raise ValueError(
                f"SimulatedExecutor(block_size={self.block_size}) on an engine with block_size "
                f"{block_manager.block_size}"
            )

    def fast_path(self, engine) -> FastPath | None:
        """``engine``'s fast path: a decode lane of plain decodes whose tokens ``tokens_at`` knows (``KnownTokens``),
        steady steps (unless ``steady_steps`` is False), and steady runs at ``lane_seconds``' cost
        (``KnownDurations``)."""
        return FastPath.of(engine, self, self.steady_steps)

    def make_clock(self) -> VirtualClock:
        return VirtualClock()

    def execute(self, output: SchedulerOutput) -> StepResult:
        tokens: dict[int, list[int]] = {}
        placeholders = self._placeholders
        for sg in islice(output.scheduled, output.lane_decodes, None):  # the lane knows its own tokens
            group = sg.group
            target = group.request.output_len
            if target is None:
                target = 1 << 62
            seqs = group.seqs
            if len(seqs) == 1 and group.n == 1:
                # The common case, inlined (this runs once per running request per step): the
                # sequence samples one token if the step computes all its uncomputed tokens.
                seq = seqs[0]
                if (
                    seq.num_computed_tokens + sg.num_tokens >= seq.num_tokens
                ):  # >: a decode with drafts samples one (all rejected)
                    position = len(seq.output) + 1
                    if position >= target:
                        tokens[seq.seq_id] = [EOS]
                    elif position < len(placeholders):
                        tokens[seq.seq_id] = [placeholders[position]]
                    else:
                        tokens[seq.seq_id] = [self._placeholder(position)]
                continue
            for seq, n in sg.samples():
                position = len(seq.output) + 1
                tokens[seq.seq_id] = [
                    EOS if position >= target else self._placeholder(position) - (i << 24) for i in range(n)
                ]
        return StepResult(charged(self.profile.step_seconds(output, self.block_size)), tokens)

    def lane_seconds(self, num_seqs: int) -> Callable[[int], float]:
        """What ``execute`` charges a step of ``num_seqs`` lane decodes, by the context tokens they read
        (``KnownDurations``)."""
        seconds = self.profile.decode_seconds(num_seqs)
        return (
            seconds if seconds(0) > 0 else lambda kv_tokens: charged(seconds(kv_tokens))
        )  # more tokens never cost less

    def tokens_at(self, group: SequenceGroup, start: int, stop: int) -> list[int]:
        """What ``execute`` samples for a one-sequence group at output positions ``start`` .. ``stop - 1``."""
        target = group.request.output_len
        last = stop if target is None else min(stop, target)
        if last <= start:
            return [EOS] * (stop - start)
        self._placeholder(last - 1)
        tokens = self._placeholders[start:last]
        if last < stop:
            tokens += [EOS] * (stop - last)
        return tokens

    def first_stop(self, group: SequenceGroup, start: int) -> int | None:
        """The first position from ``start`` whose token stops ``group``: EOS at its output length,
        or earlier a stop id that equals a placeholder."""
        target = group.request.output_len
        stops = group.stop_tokens
        found = max(start, target) if target is not None and EOS in stops else None
        for token in stops:
            position = -2 - token  # placeholders are -2 - position
            if position >= start and (target is None or position < target) and (found is None or position < found):
                found = position
        return found

    def _placeholder(self, position: int) -> int:
        """``-2 - position``, from the shared table (grown on demand)."""
        table = self._placeholders
        if position >= len(table):
            table.extend(range(-2 - len(table), -3 - position, -1))
        return table[position]


def charged(seconds: float) -> float:
    """A step's time as charged: a step that ran nothing still takes ``IDLE_SECONDS``."""
    return seconds if seconds > 0 else IDLE_SECONDS
