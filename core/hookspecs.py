"""The hooks a scheduling policy implements (pluggy project ``kvsched``).

A policy is a plugin: a class (instantiated once per engine), an instance or a module whose functions are marked
``@hookimpl``. It is registered under the entry-point group ``kvsched.policies``; ``engine --policy NAME`` loads
exactly one. Hooks are called with keyword arguments, so an implementation may accept any subset of the arguments below.

Policies decide; the core enforces. Every hook sees read-only views (``GroupView``, ``CacheView``) and acts only
through the step's validated operations, so a wrong decision raises ``PolicyError`` instead of corrupting allocator
state.
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
    """Build this step's batch by calling the operations of ``step``.

    Called once per engine step. ``step.waiting``, ``step.running`` and ``step.swapped`` are the queues as they were
    when the step began (read-only sequences of ``GroupView``, front first); ``step.now`` is the engine clock,
    ``step.config`` the engine config and ``step.cache`` a read-only view of the block manager. Decide with the step's
    operations (``StepBuilder``: ``admit``, ``advance``, ``advance_running``, ``advance_decodes``, ``swap_in``,
    ``preempt``, ``hold_back``, ``reorder_waiting``; docs/hooks.md has the table), each of which checks budgets and
    capacity and returns an ``Outcome``; short of blocks, ``advance`` asks ``choose_preemption`` for victims,
    ``admit`` asks ``can_allocate``.

    A group may be acted on once per step. Groups the policy does not touch keep their place. If this hook raises,
    or anything it tries is refused (docs/hooks.md lists what), the core undoes every operation of the step and
    raises ``PolicyError``. The return value is ignored; only one policy builds the batch (firstresult)."""


@hookspec(firstresult=True)
def choose_preemption(step: StepBuilder, requester: GroupView) -> Preemption | None:
    """Pick the victim when ``requester`` (a running group being advanced) lacks free blocks.

    Return ``Preemption(victim, mode)``: ``victim`` must be a running group not yet scheduled
    in this step, or ``requester`` itself; ``mode`` is ``PreemptionMode.SWAP`` or ``RECOMPUTE``,
    or None for the default rule (recompute a group with one running sequence, swap otherwise).
    A mode forced in the engine config always wins, and a swap that the CPU pool cannot hold
    becomes a recompute. Return None to leave the choice to the default: the newest running
    group not yet scheduled (vLLM's ``running.pop()``), else the requester.
    """


@hookspec(firstresult=True)
def can_allocate(step: StepBuilder, group: GroupView) -> AllocStatus | None:
    """Answer whether a waiting ``group`` may be admitted now: ``AllocStatus.OK``, ``LATER`` or ``NEVER``.

    Called by ``step.admit`` after the length checks and before the budget check (capacity
    first, as vLLM does). ``NEVER`` ends the request as FINISHED_IGNORED; ``LATER`` leaves it
    waiting. ``OK`` for a group whose blocks are not physically free is a ``PolicyError``. Return
    None for the default, the block manager's watermark rule (``step.cache.can_allocate(group)``):
    NEVER if the whole pool minus the watermark cannot hold the prompt, OK if it fits above the
    watermark, else LATER.
    """


@hookspec
def on_step(report: StepReport) -> None:
    """Observe a finished step: ``report.output`` (what was scheduled, an ``OutputView``),
    ``report.started`` and ``report.now`` (clock before and after), ``report.duration``, ``report.finished`` (groups
    that ended, as ``GroupView``s); the report is read-only. Every registered implementation is
    called; use it for metrics, logs or adaptive controllers. Return values are ignored. If it
    raises, the step stands and the engine raises ``PolicyError`` naming ``on_step``.
    """
