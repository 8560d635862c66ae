"""A step log for a vLLM scheduler: one JSON line per step, what it scheduled and when.

Set ``additional_config={"kvsched": {"step_log": PATH}}``. ``KvschedScheduler`` writes it, and so
does ``LoggingScheduler``, vLLM's own scheduler with nothing changed but the log, so that a run of
vLLM's rules and a run of a kvsched policy can be compared step by step, and the step times of a
real vLLM fitted into a simulator cost profile (``benchmarks/fidelity_vllm.py``). Each line holds:
``step``, ``t_schedule`` and ``t_update`` (``time.perf_counter()`` when ``schedule()`` began and
when ``update_from_output()`` began, so the model ran in between), ``schedule_s`` and ``update_s``
(the seconds spent in each: the scheduler's own overhead), ``scheduled`` (request id →
tokens), ``computed`` (request id → tokens computed before the step), ``preempted``,
``finished`` and ``free_blocks``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler


def step_log_path(vllm_config: Any) -> str | None:
    extra = vllm_config.additional_config or {}
    kvsched = extra.get("kvsched", {}) if isinstance(extra, dict) else {}
    return kvsched.get("step_log") if isinstance(kvsched, dict) else None


class StepLogging:
    """Mixed in before a vLLM ``Scheduler`` class: logs its steps when a path is configured."""

    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, *args, **kwargs)
        path = step_log_path(vllm_config)
        self._log = open(path, "a", buffering=1) if path else None  # line-buffered: a killed server loses no step
        self._logged_steps = 0
        self._lines: dict[
            int, dict[str, Any]
        ] = {}  # id of each step's output vLLM has yet to update -> its line (two under async scheduling)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self._log is None:
            return super().schedule(*args, **kwargs)
        computed = {rid: r.num_computed_tokens for rid, r in self.requests.items()}
        started = time.perf_counter()
        output = super().schedule(*args, **kwargs)
        took = time.perf_counter() - started
        scheduled = dict(output.num_scheduled_tokens)
        self._lines[id(output)] = {
            "step": self._logged_steps,
            "t_schedule": started,
            "schedule_s": took,
            "scheduled": scheduled,
            "computed": {rid: computed[rid] for rid in scheduled},
            "preempted": sorted(output.preempted_req_ids or ()),
            "free_blocks": self.kv_cache_manager.block_pool.get_num_free_blocks(),
        }
        self._logged_steps += 1
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        line = self._lines.pop(id(scheduler_output), None)
        if line is not None:  # older steps scheduled nothing: vLLM's batch queue never updates those
            for older in [k for k, v in self._lines.items() if v["step"] < line["step"]]:
                del self._lines[older]
        if self._log is None or line is None:
            return super().update_from_output(scheduler_output, model_runner_output)
        line["t_update"] = started = time.perf_counter()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        line["update_s"] = time.perf_counter() - started
        line["finished"] = sorted(
            o.request_id for eco in outputs.values() for o in eco.outputs if o.finish_reason is not None
        )
        try:
            self._log.write(json.dumps(line) + "\n")
        except OSError as exc:  # a full disk ends the log, never the engine core
            logging.getLogger("kvsched.integrations.vllm").error("kvsched: the step log stops: %s", exc)
            self._log.close()
            self._log = None
        return outputs

    def shutdown(self) -> None:
        if self._log is not None:
            self._log.close()
        super().shutdown()


class LoggingScheduler(StepLogging, Scheduler):
    """vLLM's own V1 scheduler, unchanged but for the step log."""


def read_step_log(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
