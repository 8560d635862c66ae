"""The scheduler: owns the three queues and turns a policy's decisions into a committed step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsched.allocators.block_manager import BlockManager
from kvsched.core.config import EngineConfig, PreemptionMode
from kvsched.core.errors import PolicyError
from kvsched.core.outputs import SchedulerOutput
from kvsched.core.sequence import SequenceGroup, SequenceStatus
from kvsched.core.step import StepBuilder
from kvsched.core.step_v1 import V1StepBuilder
from kvsched.core.view import CacheView

if TYPE_CHECKING:
    from kvsched.core.decode_lane import DecodeLane
    from kvsched.core.plugins import PolicyHooks

_RUNNING, _WAITING, _SWAPPED = SequenceStatus.RUNNING, SequenceStatus.WAITING, SequenceStatus.SWAPPED


class Scheduler:
    """vLLM's three queues (``waiting``, ``running``, ``swapped``, oldest first) and the block manager.

    ``schedule`` asks the policy to build a step, rolls everything back if the policy fails, and
    otherwise commits the queue and status changes in one place.
    """

    def __init__(self, config: EngineConfig, hooks: PolicyHooks) -> None:
        self.config = config
        self.hooks = hooks
        v1 = config.vllm_engine == "v1"
        self.block_manager = BlockManager(  # V1 keeps one of its blocks as a null block, never allocated
            config.block_size, config.num_gpu_blocks - v1, config.num_cpu_blocks,
            config.watermark_blocks, config.enable_prefix_caching, keep_duplicates=v1,
        )
        self._step_builder = V1StepBuilder if v1 else StepBuilder
        self.cache_view = CacheView(self.block_manager)
        self.waiting: list[SequenceGroup] = []
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.num_running_seqs = 0  # sum of max_running_seqs over running groups
        self.lane: DecodeLane | None = None  # set by the engine when its executor knows its tokens

    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def schedule(self, now: float, hooks: PolicyHooks | None = None) -> SchedulerOutput:
        """Build, validate and commit one step with the policy (or with ``hooks``: another policy
        deciding on the same state, e.g. a fallback after this one failed)."""
        hooks = hooks or self.hooks
        step = self._step_builder(self, now, hooks)
        bm = self.block_manager
        bm.begin()
        try:
            hooks.select_batch(step=step)
        except PolicyError:
            self._rollback()
            raise
        except Exception as exc:
            self._rollback()
            raise PolicyError(hooks.name, f"raised {type(exc).__name__}: {exc}") from exc
        bm.commit()
        self._commit(step)
        return step.output

    def _rollback(self) -> None:
        self.block_manager.rollback()
        if self.lane is not None:
            self.lane.rollback()

    def _commit(self, step: StepBuilder) -> None:
        out, now = step.output, step.now
        for g in step.admitted:
            g.status = _RUNNING
            for s in g.seqs:
                if s.status is _WAITING:
                    s.status = _RUNNING
                    s.num_computed_tokens = step.cached_tokens.get(s.seq_id, 0)
            if g.first_scheduled_time is None:
                g.first_scheduled_time = now
        for g in step.swapped_in:
            _set_status(g, _RUNNING)
        for g, mode in out.preempted:
            if mode is PreemptionMode.RECOMPUTE:
                _set_status(g, _WAITING)
                for s in g.seqs:
                    if s.status is _WAITING:
                        s.num_computed_tokens = 0
                g.num_recompute_preemptions += 1
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
            self.waiting = step.recomputed[::-1] + _without_prefix(self.waiting, left_waiting)
        if out.preempted:
            self.running = [g for g in self.running if g.status is _RUNNING] + step.admitted + step.swapped_in
        elif step.admitted or step.swapped_in:
            self.running = self.running + step.admitted + step.swapped_in
        if step.swapped_in or step.swapped_out or out.ignored:
            self.swapped = [g for g in self.swapped if g.status is _SWAPPED] + step.swapped_out

    def finish_group(self, group: SequenceGroup, status: SequenceStatus, now: float) -> None:
        """End every unfinished sequence of ``group`` with ``status`` and free all its blocks."""
        for s in group.seqs:
            if not s.status.is_finished:
                s.status = status
            self.block_manager.free(s)
        group.status = status
        group.num_unfinished_seqs = 0
        group.finish_time = now

    def remove_finished(self) -> None:
        self.running = [g for g in self.running if g.status <= _SWAPPED]  # an int compare: runs every few steps

    def abort(self, group: SequenceGroup, now: float, status: SequenceStatus = SequenceStatus.FINISHED_ABORTED) -> None:
        """Take ``group`` out of whichever queue holds it, free every block it held, and end it with ``status``."""
        if self.lane is not None and any(s.lane is not None for s in group.seqs):
            self.lane.dissolve()
        for name in ("waiting", "running", "swapped"):
            queue = getattr(self, name)
            if group in queue:
                queue.remove(group)
                if name == "running":
                    self.num_running_seqs -= group.max_running_seqs
        self.finish_group(group, status, now)

    def audit(self) -> list[str]:
        """Allocator invariants plus queue/status agreement and the running-sequence count."""
        problems = self.block_manager.audit()
        for name, status in (("waiting", _WAITING), ("running", _RUNNING), ("swapped", _SWAPPED)):
            for g in getattr(self, name):
                if g.status is not status:
                    problems.append(f"{g.request_id} is {g.status.name} but sits in {name}")
        counted = sum(g.max_running_seqs for g in self.running)
        if counted != self.num_running_seqs:
            problems.append(f"running sequence count {self.num_running_seqs} != {counted}")
        if self.lane is not None:
            problems += self.lane.audit(self.running)
        if self.num_running_seqs > self.config.max_num_seqs:
            problems.append(f"{self.num_running_seqs} running sequences exceed max_num_seqs {self.config.max_num_seqs}")
        return problems


def _without_prefix(waiting: list[SequenceGroup], left: int) -> list[SequenceGroup]:
    """``waiting`` without the ``left`` groups that stopped waiting in this step.

    They usually lead the queue (first come, first served), and a queue under overload holds
    thousands, so look at the front before filtering the whole list.
    """
    i = 0
    while i < left and waiting[i].status is not _WAITING:
        i += 1
    return waiting[i:] if i == left else [g for g in waiting if g.status is _WAITING]


def _set_status(group: SequenceGroup, status: SequenceStatus) -> None:
    group.status = status
    for s in group.seqs:
        if not s.status.is_finished:
            s.status = status
