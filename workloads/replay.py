"""Trace replay: a trace file's requests, windowed (start offset, request cap) and time-scaled.

``rate_scale`` multiplies the arrival rate: arrival times are divided by it, so 2.0 replays the
same requests twice as fast. ``start_offset`` (trace seconds) skips the requests that arrived
before it and re-bases time there; ``max_requests`` keeps the first that many after the offset.
A length-only file has no times: its rows, in a seeded random order, get arrivals from
``arrivals`` (Poisson by default), whose rate ``rate_scale`` also multiplies.
``max_total_tokens`` is Vidur's cut (its trace replay's ``max_tokens``): a request whose prompt
plus output exceeds it keeps its output and loses the excess from its prompt. Each request is sent
with the cap of ``cap`` (``workloads/caps.py``; by default the trace's longest recorded answer), not
its recorded answer's length.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvsched.core.request import Request, SamplingParams
from kvsched.workloads.arrivals import ArrivalProcess, Gamma, Poisson
from kvsched.workloads.caps import CapModel, Capper, FixedCap
from kvsched.workloads.errors import MAX_REQUESTS, WorkloadError
from kvsched.workloads.trace_files import TraceRow, read_trace


class TraceWorkload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["trace"] = "trace"
    path: Path
    name: str | None = Field(None, description="built-in name, when it is one")
    rate_scale: float = Field(1.0, ge=1e-9, le=1e9, description="trace times are divided by it (the times stay finite)")
    start_offset: float = Field(0.0, ge=0, description="trace seconds to skip (timed traces)")
    max_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    arrivals: ArrivalProcess | None = Field(None, description="for length-only files; default Poisson 1 req/s")
    max_total_tokens: int | None = Field(
        None, ge=2, description="cut prompts so that prompt + output <= this (Vidur's max_tokens)"
    )
    cap: CapModel = Field(
        FixedCap(), description="the max_tokens a client sends (workloads/caps.py); default: the longest answer"
    )
    seed: int = 0

    def rows(self, read: tuple[str, list[TraceRow]] | None = None) -> tuple[str, list[TraceRow]]:
        """The rows replayed (``read``: the file as ``read_trace`` gives it, if already read)."""
        fmt, rows = read or read_trace(self.path)
        if fmt == "lengths":
            rows = list(rows)
            random.Random(self.seed).shuffle(rows)
            return fmt, rows[: self.max_requests]
        if self.arrivals is not None:
            raise WorkloadError(
                "has its own arrival times; an arrival process applies only to length-only files", self.path
            )
        rows = sorted(rows, key=lambda r: r.arrival_time)
        start = rows[0].arrival_time + self.start_offset
        kept = [r for r in rows if r.arrival_time >= start][: self.max_requests]
        if not kept:
            raise WorkloadError(
                f"no requests at or after start offset {self.start_offset} s (trace spans "
                f"{rows[-1].arrival_time - rows[0].arrival_time:.1f} s)",
                self.path,
            )
        return fmt, kept

    def requests(self) -> list[Request]:
        return list(self.iter_requests())

    def iter_requests(self) -> Iterator[Request]:
        """The requests in arrival order, made one at a time (the rows are read first)."""
        read = read_trace(self.path)
        fmt, rows = self.rows(read)
        if fmt == "lengths":
            process = self.arrivals or Poisson(rate=1.0)
            process = process.model_copy(update={"rate": process.rate * self.rate_scale})
            gaps = process.gaps(random.Random(self.seed + 1))
            times, t = [], 0.0
            for _ in rows:
                t += next(gaps)
                times.append(t)
        else:
            start = rows[0].arrival_time
            times = [(r.arrival_time - start) / self.rate_scale for r in rows]
        cap = self.max_total_tokens
        too_long = next((i for i, r in enumerate(rows) if cap is not None and r.output_tokens >= cap), None)
        if too_long is not None:
            raise WorkloadError(
                f"request {too_long}: its {rows[too_long].output_tokens} output tokens alone reach "
                f"max_total_tokens {cap}",
                self.path,
            )
        capper = Capper(self.cap, max(r.output_tokens for r in read[1]), self.seed)
        cache: dict[int, SamplingParams] = {}
        for i, (row, t) in enumerate(zip(rows, times)):
            limit, output = capper(row.output_tokens)
            sp = cache.get(limit)
            if sp is None:
                sp = cache[limit] = SamplingParams(max_tokens=limit)
            prompt = row.prompt_tokens
            if cap is not None and prompt + output > cap:
                prompt = cap - output
            yield Request(
                request_id=f"req-{i}",
                prompt_len=prompt,
                output_len=output,
                arrival_time=round(t, 6),
                sampling=sp,
                priority=row.priority,
                tenant=row.tenant,
            )

    def num_cut(self) -> int:
        """Prompts that ``max_total_tokens`` shortens."""
        cap = self.max_total_tokens
        return 0 if cap is None else sum(r.prompt_tokens + r.output_tokens > cap for r in self.rows()[1])

    @property
    def num_requests(self) -> int:
        return len(self.rows()[1])

    def tenant_names(self) -> set[str]:
        return {r.tenant for r in self.rows()[1]}

    def describe(self) -> dict:
        d = self.model_dump(mode="json", exclude={"max_total_tokens"} if self.max_total_tokens is None else None)
        if self.name:
            d["path"] = Path(self.path).name  # a built-in's install location is not part of the result
        return d


__all__ = ["TraceWorkload", "Gamma", "Poisson"]
