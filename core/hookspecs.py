"""The hooks a scheduling policy implements (pluggy project ``kvsched``; docs/hooks.md is the full reference).

A policy is a class (instantiated once per engine), an instance or a module with ``@hookimpl`` functions, registered
under the entry-point group ``kvsched.policies``. Hooks are called with keyword arguments, so an implementation may
take any subset of them. Policies decide; the core enforces: hooks see read-only views and act only through the
step's validated operations, so a wrong decision raises ``PolicyError`` instead of corrupting engine state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from kvsched.allocators.alloc_status import AllocStatus
    from kvsched.core.decisions import Preemption
    from kvsched.core.report import StepReport
    from kvsched.core.step import StepBuilder
    from kvsched.core.view import GroupView

PROJECT = "kvsched"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(firstresult=True)
def select_batch(step: StepBuilder) -> object | None:
    """Build this step's batch with the operations of ``step`` (``admit``, ``advance``, ``advance_running``,
    ``advance_decodes``, ``swap_in``, ``preempt``, ``hold_back``, ``reorder_waiting``), each of which checks budgets
    and capacity and returns an ``Outcome``. ``step.waiting``, ``.running`` and ``.swapped`` are the queues as the
    step began (``GroupView``s, front first); ``step.now``, ``step.config`` and ``step.cache`` the clock, the config and
    the block manager, read-only. A group may be acted on once per step; untouched ones keep their place. If the hook
    raises or anything it tries is refused, the whole step is undone and ``PolicyError`` raised. The return value is
    ignored."""


@hookspec(firstresult=True)
def choose_preemption(step: StepBuilder, requester: GroupView) -> Preemption | None:
    """Pick a victim when ``requester`` (a running group being advanced) lacks free blocks: ``Preemption(victim,
    mode)``, the victim a running group not yet scheduled in this step or ``requester`` itself; ``mode`` ``SWAP``,
    ``RECOMPUTE`` or None (recompute a group with one running sequence, swap otherwise). A mode forced in the config
    wins, and a swap the CPU pool cannot hold becomes a recompute. None: the newest running group not yet scheduled
    (vLLM's ``running.pop()``), else the requester."""


@hookspec(firstresult=True)
def can_allocate(step: StepBuilder, group: GroupView) -> AllocStatus | None:
    """May waiting ``group`` be admitted now: ``AllocStatus.OK``, ``LATER`` (it waits) or ``NEVER`` (it ends as
    FINISHED_IGNORED). Asked by ``step.admit`` after the length checks, before the budget check, as vLLM does; OK for
    blocks that are not free is a ``PolicyError``. None: the block manager's watermark rule
    (``step.cache.can_allocate(group)``)."""


@hookspec
def on_step(report: StepReport) -> None:
    """Observe a finished step (``report.output``, an ``OutputView``; ``report.finished``, the groups that ended; all
    read-only). Every implementation is called; return values are ignored. If it raises, the step stands and the
    engine raises ``PolicyError`` naming ``on_step``."""
