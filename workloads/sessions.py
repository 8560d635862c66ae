"""Multi-turn chat sessions: each turn's prompt is the whole conversation so far, so a replica that
served a session's last turn holds most of its next prompt in its prefix cache.

A session starts at Poisson times (``rate`` sessions per second), picks one of
``system_prompts`` shared system prompts, and sends ``turns`` requests, each ``think_time_s``
(exponential, mean) after the previous one was sent (open loop: a turn does not wait for the
answer, so the replay is deterministic). Turn k's prompt is turn k−1's prompt, then the answer and
the new user message as fresh token ids (the simulator's answer tokens are placeholders, so the
answer's own KV blocks are not shared: only the previous prompt is), and a session ends early once
its prompt would pass ``max_context``. Each turn carries its session's id (``session_id``, e.g.
``s3``), which session-aware policies and ``engine bench`` read, and its session's SLO class when
``slo_classes`` gives a mix (one class a session, as a chat product's tier is the user's). Requests are made one at a
time, in arrival order.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvsched.core.request import Label, Request, SamplingParams
from kvsched.workloads.caps import CapModel, Capper, FixedCap
from kvsched.workloads.distributions import LengthDist, LogNormal, Uniform
from kvsched.workloads.errors import MAX_PROMPT_IDS, MAX_REQUESTS, WorkloadError
from kvsched.workloads.synthetic import Mix, check_weights

_FRESH = 1 << 40  # token ids of answers and user messages start here (system prompts use ids below)
T = TypeVar("T")


class SessionSpec(BaseModel):
    """Multi-turn sessions sharing a few system prompts (``{"kind": "sessions", ...}`` as JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["sessions"] = "sessions"
    num_sessions: int = Field(200, ge=1, le=1_000_000)
    rate: float = Field(1.0, gt=0, description="sessions started per second (Poisson)")
    turns: LengthDist = Uniform(low=2, high=8)
    think_time_s: float = Field(5.0, gt=0, description="mean time between a session's turns (exponential)")
    system_prompts: int = Field(4, ge=1, le=10_000, description="distinct system prompts the sessions share")
    system_len: int = Field(512, ge=1, le=1_000_000)
    user: LengthDist = LogNormal(median=120, sigma=0.6, max=1024)
    output: LengthDist = LogNormal(median=150, sigma=0.6, max=512)
    max_context: int = Field(
        3584, ge=2, le=MAX_PROMPT_IDS, description="a session ends before its prompt would pass this many tokens"
    )
    slo_classes: dict[Label, float] | None = Field(
        None, description="weights of each session's SLO class; none: no class"
    )
    cap: CapModel = Field(
        FixedCap(), description="the max_tokens a client sends (workloads/caps.py); default: the longest output"
    )
    seed: int = 0

    _weights = field_validator("slo_classes")(classmethod(lambda cls, v: check_weights(v)))

    @model_validator(mode="after")
    def _bounded(self) -> SessionSpec:
        """The requests the sessions can make, counted before any is: each turn adds at least two tokens
        (a user's, an answer's) to a context of at most ``max_context``."""
        turns = min(self.turns.most, self.max_context // 2)
        if self.num_sessions * turns > MAX_REQUESTS:
            raise ValueError(
                f"{self.num_sessions:,} sessions of up to {turns:,} turns make up to "
                f"{self.num_sessions * turns:,} requests; at most {MAX_REQUESTS:,}"
            )
        return self

    def requests(self) -> list[Request]:
        return list(self.iter_requests())

    def iter_requests(self) -> Iterator[Request]:
        """Every turn of every session, in arrival order (sessions in flight are merged on a heap)."""
        return in_arrival_order(self._sessions(), lambda request: request.arrival_time)

    def _sessions(self) -> Iterator[tuple[float, Iterator[Request]]]:
        rng = random.Random(self.seed)
        start, fresh = 0.0, _FRESH
        slo_mix = Mix(self.slo_classes or {None: 1.0})  # drawn from only when it has a choice: no class, same stream
        capper = Capper(self.cap, self.output.upper, self.seed)
        for s in range(self.num_sessions):
            start += rng.expovariate(self.rate)
            turns = self.turns.sample(rng)
            system = rng.randrange(self.system_prompts)
            own = random.Random(rng.getrandbits(64))
            yield start, self._session(s, start, turns, system, own, fresh, slo_mix.pick(rng), capper)
            fresh += 1 << 24  # each session's own ids

    def _session(
        self,
        s: int,
        t: float,
        turns: int,
        system: int,
        rng: random.Random,
        fresh: int,
        slo_class: str | None,
        capper: Capper,
    ) -> Iterator[Request]:
        prompt = tuple(range(system * self.system_len, (system + 1) * self.system_len))
        answer: tuple[int, ...] = ()
        for k in range(turns):
            user = self.user.sample(rng)
            longer = prompt + answer + tuple(range(fresh, fresh + user))
            fresh += user
            output = self.output.sample(rng)
            if len(longer) + output > self.max_context:
                return
            cap, output = capper(output)
            prompt = longer
            yield Request(
                request_id=f"s{s}-t{k}",
                prompt_token_ids=prompt,
                output_len=output,
                arrival_time=round(t, 6),
                sampling=SamplingParams(max_tokens=cap),
                tenant="default",
                session_id=f"s{s}",
                slo_class=slo_class,
            )
            answer = tuple(range(fresh, fresh + output))
            fresh += output
            t += rng.expovariate(1.0 / self.think_time_s)

    @property
    def num_requests(self) -> int:
        """How many turns the sessions send (counted by making them: a session's length depends on its draws)."""
        return sum(1 for _ in self.iter_requests())

    def tenant_names(self) -> set[str]:
        return {"default"}

    def describe(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def in_arrival_order(sessions: Iterable[tuple[float, Iterator[T]]], time_of: Callable[[T], float]) -> Iterator[T]:
    """The items of many sessions in time order, made as they are needed: ``sessions`` yields each
    session's start (in increasing order) and its items (in time order, none before its start); the
    sessions under way wait on a heap, each with its next item."""
    heap: list[tuple[float, int, T, Iterator[T]]] = []

    def earliest() -> T:
        _, s, item, rest = heap[0]
        following = next(rest, None)
        if following is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (time_of(following), s, following, rest))
        return item

    for s, (start, items) in enumerate(sessions):
        while heap and heap[0][0] <= start:
            yield earliest()
        first = next(items, None)
        if first is not None:
            heapq.heappush(heap, (time_of(first), s, first, items))
    while heap:
        yield earliest()


def session_spec(data: dict, path, num_requests: int | None, seed: int, rate_scale: float, model: type = SessionSpec):
    """A ``{"kind": "sessions"}`` workload spec, or another of sessions started at a ``rate`` (``model``:
    ``LongContextSpec``): ``num_requests`` caps the sessions, ``rate_scale`` scales their rate, validated with
    them applied: the command line cannot take it past a bound."""
    data = {"seed": seed, **data}
    try:
        spec = model.model_validate(data)
        given = {"num_sessions": num_requests} if num_requests is not None else {}
        if rate_scale != 1.0:
            given["rate"] = spec.rate * rate_scale
        return model.model_validate({**spec.model_dump(), **given}) if given else spec
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(map(str, first["loc"]))
        kind = model.model_fields["kind"].default
        options = " (with --num-requests and --rate-scale)" if num_requests is not None or rate_scale != 1.0 else ""
        raise WorkloadError(
            f"invalid {kind} spec{options}: {field + ': ' if field else ''}"
            f"{first['msg'].removeprefix('Value error, ')}",
            path,
        ) from None
