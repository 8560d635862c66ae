"""vLLM's classic default scheduler (v0.3–v0.6 ``_schedule_default``), the reference policy."""

from __future__ import annotations

from kvsched.core.decisions import Outcome
from kvsched.core.hookspecs import hookimpl

_STOP_ADMITTING = (Outcome.LATER, Outcome.BUDGET)


class VllmDefault:
    """vLLM v0 default: swap-first, FCFS prefill behind the delay gate, prefill-only steps, tail preemption.

    Each step, in vLLM's order:

    1. Only if no group is swapped out: admit waiting groups first-come-first-served while the
       delay gate is open; LATER or an exhausted budget stops admission (head-of-line), NEVER
       drops the group and goes on.
    2. A step that admitted anything is prefill-only.
    3. Otherwise advance every running group, oldest first; short of blocks, the core preempts
       the newest unscheduled group (recompute for one sequence, swap for several).
    4. Only in a step that preempted nothing, swap groups back in, oldest first, until one does
       not fit.
    """

    name = "vllm-default"
    fcfs = True  # waiting groups in queue order, head of line: the delay gate says when it holds them back

    def __init__(self) -> None:
        self._prev_time = 0.0
        self._prev_prompt = False
        self._last_prompt_latency = 0.0

    def _passed_delay(self, step) -> bool:
        """vLLM's gate: the oldest waiting request waited longer than delay_factor × the last prompt latency, or
        nothing runs."""
        now = step.now
        if self._prev_prompt:
            self._last_prompt_latency = now - self._prev_time
        self._prev_time, self._prev_prompt = now, False
        if step.config.delay_factor > 0:  # the scan is O(waiting): skip it when the gate is off
            arrivals = [g.arrival_time for g in step.waiting if not step.was_touched(g)]
            if arrivals:
                waited, limit = now - min(arrivals), step.config.delay_factor * self._last_prompt_latency
                if waited > limit or not step.running:
                    return True
                step.hold_back(
                    "delay gate",
                    waited_s=waited,
                    limit_s=limit,
                    delay_factor=step.config.delay_factor,
                    last_prompt_latency_s=self._last_prompt_latency,
                )
                return False
        return True

    @hookimpl
    def select_batch(self, step):
        if step.swapped:
            if step.waiting:
                step.hold_back("swapped queue not empty", swapped=len(step.swapped))
        else:
            for group in step.waiting:
                if not self._passed_delay(step):
                    break
                if step.admit(group) in _STOP_ADMITTING:  # FCFS never looks behind the group it stopped at
                    break
            else:
                self._passed_delay(step)  # vLLM evaluates the gate once more on an empty queue
            if step.admitted:
                self._prev_prompt = True
                return True
        step.advance_running()  # oldest first; evicts from the tail when short of blocks
        if step.num_preempted == 0:
            for group in step.swapped:
                if step.swap_in(group) in _STOP_ADMITTING:
                    break
        return True
