"""inference-perf's client, run against a simulated engine: what no fixed list of arrivals can say.

Three things in inference-perf 0.7's load generator depend on the server's answers:

- **stages drain**: a stage's requests are all sent and answered (or failed) before the next stage
  starts, ``load.interval`` seconds later (``LoadGenerator.run_stage`` waits on its finished count);
- **a multi-turn user waits**: a user's round is sent only once its round before has answered (a
  lock in ``LocalUserSession.get_context``), and its prompt is the user's context (the last round's
  prompt and answer) followed by the user's question; sessions restart empty at each stage;
- **the client gives up**: a request without its whole answer within the timeout (aiohttp's 300 s
  unless ``request_timeout`` says otherwise) fails, and vLLM aborts it, freeing its blocks. A request
  whose prompt and ``max_tokens`` pass the model's length is refused at once (vLLM's 400).

``ClientLoop`` runs the engine stage by stage (``Engine.run`` until it drains), adding each request
from an ``on_step`` observer once its send time has passed (as the engine itself adds arrivals: at
the next step; under async scheduling, the one after), releasing a waiting round when the round
before finishes and aborting what has run out of time. Times are the engine's: a request's
``arrival_time`` is its send time; the serving stack's time outside the engine (``Efficiency``'s
``api_ms`` and ``response_ms``) is passed in as ``overheads``, and delays a follow-up round and
brings a timeout forward by as much. The steady-run fast path is off (an observer must see each step).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

from kvsched.core.view import group_of
from kvsched.workloads.inference_perf import ClientRecord

DONE = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")

if TYPE_CHECKING:
    from kvsched.core.engine import Engine
    from kvsched.core.report import StepReport
    from kvsched.workloads.inference_perf import InferencePerfWorkload


class ClientLoop:
    def __init__(
        self, workload: InferencePerfWorkload, engine: Engine, overheads: tuple[float, float] = (0.0, 0.0)
    ) -> None:
        self.workload, self.engine = workload, engine
        self.api_s, self.response_s = overheads
        self.records: list[ClientRecord] = []
        self.left = workload.num_requests  # requests still to be made (a cap may cut the last stage short)

    def run(self, on_step=None) -> list[ClientRecord]:
        engine = self.engine
        self.on_step = on_step
        start = engine.now
        for stage in range(len(self.workload.stages)):
            if not self.left:
                break
            self._stage(stage, start)
            start = engine.now + self.workload.stage_gap()
        return self.records

    def _stage(self, stage: int, start: float) -> None:
        w = self.workload
        times = w.send_times(stage, start)[: self.left]
        self.left -= len(times)
        self.stage = stage
        self.due = [(float(t), i) for i, t in enumerate(times)]  # (send time, index): sorted, so a heap already
        self.scheduled = {i: float(t) for i, t in enumerate(times)}
        self.open: dict[str, tuple[int, float]] = {}  # request id: (index, send time), in flight
        self.deadlines: list[tuple[float, str]] = []
        self.busy: set[int] = set()
        self.waiting: dict[int, deque[int]] = {}  # a busy user's rounds, in the order they fell due
        self.context: dict[int, tuple[int, ...]] = {}
        while self.due:
            t, i = heapq.heappop(self.due)
            first = self._make(i, t)
            if first is not None:
                self.engine.run(iter([first]), on_step=self._observe)

    # ----------------------------------------------------------------- one request
    def _make(self, index: int, sent: float):
        """The request ``index`` sends at ``sent``, or None if it waits for its user or is refused."""
        w, engine = self.workload, self.engine
        user = w.user(index)
        if user is not None and user in self.busy:
            self.waiting.setdefault(user, deque()).append(index)
            return None
        request = w.request(self.stage, index, sent, self.context.get(user, ()))
        if request.prompt_len + request.sampling.max_tokens > engine.config.model_len:
            self._record(request.request_id, index, sent, "refused")
            return None
        if user is not None:
            self.busy.add(user)
        self.open[request.request_id] = (index, sent)
        heapq.heappush(self.deadlines, (sent + w.timeout_s - self.api_s - self.response_s, request.request_id))
        return request

    def _record(self, request_id: str, index: int, sent: float | None, outcome: str) -> None:
        self.records.append(ClientRecord(request_id, self.stage, self.scheduled[index], sent, outcome))

    def _done(self, request_id: str, outcome: str, now: float, answer: tuple[int, ...] | None = None) -> None:
        """``request_id`` ended: record it, and let its user's next round go."""
        index, sent = self.open.pop(request_id)
        self._record(request_id, index, sent, outcome)
        user = self.workload.user(index)
        if user is None:
            return
        self.busy.discard(user)
        if answer is not None:  # the session's context: this round's prompt and its answer (a failure keeps the old)
            self.context[user] = answer
        queue = self.waiting.get(user)
        if queue:
            heapq.heappush(self.due, (now + self.api_s + self.response_s, queue.popleft()))

    # ----------------------------------------------------------------- the observer
    def _observe(self, report: StepReport) -> None:
        engine, now = self.engine, report.now
        for view in report.finished:
            group = group_of(view)
            if group.request_id in self.open:
                if group.status.name not in DONE:  # ignored: a prompt the KV cache can never hold
                    self._done(group.request_id, "refused", now)
                    continue
                answer = None
                if self.workload.multi_turn:
                    answer = tuple(group.request.prompt_token_ids) + tuple(group.seqs[0].output)
                self._done(group.request_id, "ok", now, answer)
        deadlines = self.deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, request_id = heapq.heappop(deadlines)
            if request_id in self.open and engine.abort(request_id):
                self._done(request_id, "timeout", deadline)
        horizon = report.started if engine.config.async_scheduling and report.started is not None else now
        due = self.due
        while due and due[0][0] <= horizon:
            t, i = heapq.heappop(due)
            request = self._make(i, t)
            if request is not None:
                engine.add_request(request)
        if self.on_step is not None:
            self.on_step(report)
