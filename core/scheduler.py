"""The scheduler: owns the three queues and turns a policy's decisions into a committed step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.allocators.alloc_status import AllocStatus
from kvsched.allocators.offloading import Offloading
from kvsched.core.config import EngineConfig, PreemptionMode
from kvsched.core.outputs import SchedulerOutput
from kvsched.core.sequence import SequenceGroup, SequenceStatus
from kvsched.core.step_state import StepState
from kvsched.core.view import CacheView, frozen

if TYPE_CHECKING:
    from kvsched.core.executor import FastPath
    from kvsched.core.mechanics import Mechanics
    from kvsched.core.plugins import PolicyHooks

_RUNNING, _WAITING, _SWAPPED = SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.SWAPPED


class Scheduler:
    """vLLM's three queues (``waiting``, ``running``, ``swapped``, oldest first) and the block manager. ``schedule``
    has the policy build a step, rolls it all back if the policy fails (the exception then propagates unchanged), and
    otherwise commits the queue and status changes in one place."""

    def __init__(self, config: EngineConfig, hooks: PolicyHooks, mechanics: Mechanics) -> None:
        self.config = config
        self.hooks = hooks
        self.block_manager = mechanics.block_manager(config)
        self.mechanics = mechanics
        self.offloading = None
        if config.kv_offloading_blocks:
            if not mechanics.offloads:
                raise ValueError(
                    f"kv_offloading_blocks needs V1 mechanics (vllm_engine v1, as vllm-v1 sets), not {mechanics.name}"
                )
            blocks, policy = config.kv_offloading_blocks, config.kv_offloading_policy
            self.offloading = Offloading(self.block_manager, blocks, policy, config.offload_prompt_only)
        # Speculative decoding: the sequences with draft tokens for their next step (Mechanics.drafts).
        drafts = mechanics.drafts is not None and config.num_speculative_tokens
        self.drafting: set[int] | None = set() if drafts else None
        self.cache_view = CacheView(self.block_manager)
        self.config_view = frozen(config)  # step.config: the engine's own is not handed out
        self.waiting: list[SequenceGroup] = []
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.num_running_seqs = 0  # sum of max_running_seqs over running groups
        # The simulator's fast path (executor.py's FastPath), set by the engine if its executor has one.
        self.fast_path: FastPath | None = None

    def add(self, group: SequenceGroup) -> None:
        group.block_manager = self.block_manager
        self.waiting.append(group)

    def schedule(self, now: float, hooks: PolicyHooks | None = None) -> SchedulerOutput:
        """Build, validate and commit one step with the policy (or ``hooks``, a fallback on the same state)."""
        if self.fast_path is not None and (out := self.fast_path.replay(hooks is None)) is not None:
            return out
        waiting, hooks = self.waiting, hooks or self.hooks
        step = self.mechanics.step(self, now, hooks)
        bm = self.block_manager
        bm.begin()
        try:
            hooks.select_batch(step.step)
        except BaseException:
            self.waiting = waiting  # as the step found it, if the policy reordered it
            self._rollback()
            raise
        finally:
            step.close()
        bm.commit()
        self._commit(step)
        if self.offloading is not None:
            self.offloading.commit(
                [(sg.group.request_id, sg.group.seqs[0], sg.num_tokens) for sg in step.output.scheduled]
            )
        if self.drafting is not None:
            self.mechanics.drafts(self.drafting, step.output, self.running)
        if self.fast_path is not None and hooks is self.hooks:
            self.fast_path.record(step, waiting)  # cut in place by _commit only where it is not steady
        return step.output

    def _rollback(self) -> None:
        self.block_manager.rollback()
        if self.offloading is not None:
            self.offloading.rollback()
        if self.fast_path is not None:
            self.fast_path.rollback()

    def _commit(self, step: StepState) -> None:
        out, now = step.output, step.now
        for g in step.admitted:
            g.status = _RUNNING
            for s in g.seqs:
                if s.status is _WAITING:
                    s.status = _RUNNING
                    s.num_computed_tokens = step.cached_tokens.get(s.seq_id, 0)
            g.note_admission(sum(step.cached_tokens.get(s.seq_id, 0) for s in g.seqs))
            if g.first_scheduled_time is None:
                g.first_scheduled_time = now
        for g in out.swapped_in:
            _set_status(g, _RUNNING)
        for g, mode in out.preempted:
            if mode is PreemptionMode.RECOMPUTE:
                _set_status(g, _WAITING)
                g.note_recompute(sum(s.num_computed_tokens for s in g.seqs if s.status is _WAITING))
                for s in g.seqs:
                    if s.status is _WAITING:
                        s.num_computed_tokens = 0
                g.num_recompute_preemptions += 1
                g.last_queued_time = now
            else:
                _set_status(g, _SWAPPED)
                g.num_swap_preemptions += 1
        left_waiting = len(step.admitted) + sum(1 for g in out.ignored if g.status is _WAITING)
        for g in out.ignored:
            g.finish_detail = step.ignore_reasons[g]
            self.finish_group(g, SequenceStatus.FINISHED_IGNORED, now)
        self.num_running_seqs = step.num_running_seqs
        if left_waiting or step.recomputed:
            # Recompute victims go to the front, the earliest-evicted (newest) last, as vLLM's extendleft.
            self.waiting = _without_prefix(self.waiting, left_waiting, step.recomputed)
        if out.preempted:
            self.running = [g for g in self.running if g.status is _RUNNING] + step.admitted + out.swapped_in
        elif step.admitted or out.swapped_in:
            self.running = self.running + step.admitted + out.swapped_in
        if out.swapped_in or step.swapped_out or out.ignored:
            self.swapped = [g for g in self.swapped if g.status is _SWAPPED] + step.swapped_out

    def finish_group(self, group: SequenceGroup, status: SequenceStatus, now: float) -> None:
        """End every unfinished sequence of ``group`` with ``status`` and free all its blocks."""
        if self.offloading is not None:
            self.offloading.finish(group.request_id, group.seqs[0])
        _set_status(group, status)
        for s in group.seqs:
            self.block_manager.free(s)
        group.num_unfinished_seqs = 0
        group.finish_time = now

    def remove_finished(self, ended: list[SequenceGroup] | None = None) -> None:
        """A new running queue without the finished groups (``ended``: exactly those, when the caller knows them)."""
        running = self.running.copy() if ended is not None else [g for g in self.running if g.status <= _SWAPPED]
        for g in ended or ():
            running.remove(g)
        self.running = running

    def seqs_ended(self, n: int) -> None:
        """``n`` running sequences ended that the completion step did not count (the fast path's): uncounted."""
        self.num_running_seqs -= n

    def abort(self, group: SequenceGroup, now: float, status: SequenceStatus = SequenceStatus.FINISHED_ABORTED) -> None:
        """Take ``group`` out of whichever queue holds it, free every block it held, and end it with ``status``."""
        if self.fast_path is not None:
            self.fast_path.touch(group)
        if group in self.running:
            self.num_running_seqs -= group.max_running_seqs
        for queue in (self.waiting, self.running, self.swapped):
            if group in queue:
                queue.remove(group)
        self.finish_group(group, status, now)

    def stuck_report(self) -> str:
        """What a stall error says: the queues and why the oldest waiting (else swapped, else running) request waits."""
        g = min(self.waiting or self.swapped or self.running, key=lambda g: g.index)
        bm, name = self.block_manager, self.hooks.name
        head = (
            f"{len(self.waiting)} waiting, {len(self.running)} running, {len(self.swapped)} swapped; "
            f"the oldest {g.status.name.lower()} request, {g.request_id} (arrived at {g.arrival_time:.3f} s),"
        )
        allocate = bm.can_allocate if g.status is _WAITING else bm.can_swap_in
        status = AllocStatus.OK if g.status is _RUNNING else allocate(g)
        if status is AllocStatus.NEVER or max(s.num_tokens for s in g.seqs) > self.config.model_len:
            return f"{head} can never run, but policy {name!r} does not try it (which would end it as ignored)"
        if status is AllocStatus.LATER:
            return f"{head} needs more GPU blocks than the {bm.gpu.num_free} free (watermark {bm.watermark_blocks})"
        return f"{head} fits the KV cache and the budgets now, but policy {name!r} does not schedule it"

    def audit(self) -> list[str]:
        """The allocator's invariants, each queue's statuses, who holds blocks and the running-sequence count."""
        problems = self.block_manager.audit()
        for name, status in (("waiting", _WAITING), ("running", _RUNNING), ("swapped", _SWAPPED)):
            for g in getattr(self, name):
                if g.status is not status:
                    problems.append(f"{g.request_id} is {g.status.name} but sits in {name}")
        # Only running sequences hold GPU blocks (enough for their computed tokens), only swapped ones CPU blocks.
        seqs = [s for queue in (self.waiting, self.running, self.swapped) for g in queue for s in g.seqs]
        problems += self.block_manager.audit_holders(
            {s.seq_id: s.num_computed_tokens for s in seqs if s.status is _RUNNING},
            {s.seq_id for s in seqs if s.status is _SWAPPED},
        )
        counted = sum(g.max_running_seqs for g in self.running)
        if counted != self.num_running_seqs:
            problems.append(f"running sequence count {self.num_running_seqs} != {counted}")
        if self.fast_path is not None:
            problems += self.fast_path.audit(self.running)
        if self.num_running_seqs > self.config.max_num_seqs:
            problems.append(f"{self.num_running_seqs} running sequences exceed max_num_seqs {self.config.max_num_seqs}")
        return problems


def _without_prefix(waiting: list[SequenceGroup], left: int, recomputed: list[SequenceGroup]) -> list[SequenceGroup]:
    """``waiting`` without the ``left`` groups that stopped waiting, ``recomputed`` in front: usually its front, cut in
    place (a copy is thousands a step under overload)."""
    if next((k for k in range(left) if waiting[k].status is _WAITING), left) < left:  # not just its front
        return recomputed[::-1] + [g for g in waiting if g.status is _WAITING]
    del waiting[:left]
    return recomputed[::-1] + waiting if recomputed else waiting


def _set_status(group: SequenceGroup, status: SequenceStatus) -> None:
    group.status = status
    for s in group.seqs:
        if not s.status.is_finished:
            s.status = status
