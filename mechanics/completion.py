"""The completion step: a step ran; count its computed tokens, append its samples, fork, and end the sequences that
stopped or reached their cap. The mechanics may choose another strategy (``async_lag.py``)."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from kvsched.core.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.outputs import SchedulerOutput
    from kvsched.core.sequence import SequenceGroup


class Completion:
    """Applies each step's outputs as they come (a sync engine)."""

    timed = False  # True: the step's time includes the scheduler's (``charge`` and ``ran``)
    lags = False  # True: the scheduler sees arrivals later than they come (``seen_at``)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sched = engine.scheduler
        self.bm = engine.scheduler.block_manager
        self.caching = engine.config.enable_prefix_caching and engine.mechanics.names_as_applied

    def seen_at(self, now: float) -> float:
        """When the next step's scheduler sees the requests arriving by ``now``."""
        return now

    def apply(self, output: SchedulerOutput, tokens: dict[int, list[int]], now: float) -> list[SequenceGroup]:
        """Apply the step's sampled ``tokens`` (by sequence id) at ``now``: the groups that ended."""
        sched, bm, caching, append = self.sched, self.bm, self.caching, self.append
        finished = list(output.ignored)
        any_finished = sched.fast_path.apply(self, now, finished) if output.lane_decodes else False
        for sg in islice(output.scheduled, output.lane_decodes, None):
            group = sg.group
            seqs = group.seqs
            single = group.n == 1  # then the step reserved one running sequence for it
            reserved = 1 if single else group.max_running_seqs
            if single and len(seqs) == 1:  # the common case, compute() inlined: no fork, no chunk list
                seq = seqs[0]
                computed = seq.num_computed_tokens = seq.num_computed_tokens + sg.num_tokens
                if computed > seq.num_tokens:  # a decode with draft tokens (V1 speculative decoding)
                    self.verify(seq, sg.num_tokens, tokens[seq.seq_id], now)
                else:
                    if caching:
                        bm.mark_computed(seq)
                    if computed == seq.num_tokens:
                        append(seq, tokens[seq.seq_id][0], now)
            else:  # seq_chunks() is fixed here, before an n > 1 prompt step forks children into seqs
                for seq, n in sg.seq_chunks():
                    self.compute(seq, n, tokens, now)
            if group.num_unfinished_seqs == 0:
                end_group(group, now, finished)
                any_finished = True
            sched.num_running_seqs += (group.num_unfinished_seqs if single else group.max_running_seqs) - reserved
        if any_finished:
            sched.remove_finished()
        return finished

    def compute(self, seq: Sequence, n: int, tokens: dict[int, list[int]], now: float) -> None:
        computed = seq.num_computed_tokens = seq.num_computed_tokens + n
        if self.caching:
            self.bm.mark_computed(seq)
        if computed < seq.num_tokens:
            return  # a prefill chunk: nothing sampled yet
        sampled = tokens[seq.seq_id]
        if len(sampled) > 1:  # the prompt step of n > 1: one child per extra sample
            group = seq.group
            for token in sampled[1:]:
                child = Sequence(self.engine.new_seq_id(), group, seq.prompt, list(seq.output))
                child.status = seq.status
                child.num_computed_tokens = seq.num_computed_tokens
                self.bm.fork(seq, child)
                group.seqs.append(child)
                group.num_unfinished_seqs += 1
                self.append(child, token, now)
        self.append(seq, sampled[0], now)

    def verify(self, seq: Sequence, scheduled: int, sampled: list[int], now: float) -> None:
        """``seq`` ran ``scheduled - 1`` drafts and sampled the accepted ones plus one: roll the rejected back (V1's
        ``num_computed_tokens -= num_rejected``) and append the tokens until one stops it."""
        accepted = len(sampled) - 1
        if not 0 <= accepted < scheduled:
            raise RuntimeError(f"{seq!r} ran {scheduled - 1} draft tokens, the executor sampled {len(sampled)} tokens")
        seq.num_computed_tokens -= scheduled - 1 - accepted
        for token in sampled:
            self.append(seq, token, now)
            if seq.status > SequenceStatus.SWAPPED:
                break

    def append(self, seq: Sequence, token: int, now: float) -> None:
        group = seq.group
        seq.append_token(token)
        group.num_generated_tokens += 1
        if group.first_token_time is None:
            group.first_token_time = now
        self.stop_if_done(seq, token)

    def stop_if_done(self, seq: Sequence, token: int) -> bool:
        """End ``seq`` if ``token`` (its newest) stops it or it reached its cap; free its blocks."""
        group = seq.group
        if token in group.stop_tokens:
            status = SequenceStatus.FINISHED_STOPPED
        elif seq.num_tokens >= group.max_seq_tokens:
            status = SequenceStatus.FINISHED_LENGTH_CAPPED
        else:
            return False
        seq.status = status
        if self.sched.offloading is not None:  # its prompt's blocks go to the CPU tier first
            self.sched.offloading.finish(group.request_id, seq)
        self.bm.free(seq)
        group.num_unfinished_seqs -= 1
        return True


def end_group(group: SequenceGroup, now: float, finished: list[SequenceGroup]) -> None:
    group.status = max(s.status for s in group.seqs)  # any finished state; STOPPED < CAPPED
    group.finish_time = now
    finished.append(group)
