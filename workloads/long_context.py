"""Long-context conversations whose prompts are given as block hashes, the shape of Mooncake's
conversation trace: prompts of thousands to a hundred thousand tokens, each turn's prompt the whole
conversation so far, sessions on a few shared system prompts, turns minutes apart.

A session starts at Poisson times (``rate`` per second), takes one of ``system_prompts`` shared
system prompts of ``system_blocks`` blocks, and sends ``turns`` requests ``think_time_s`` apart
(exponential, from the previous send: open loop, as ``workloads/sessions.py``). Its first prompt is
the system prompt and then ``context`` tokens of its own (the document or history the user brings);
each later prompt is the previous one, its answer and ``turn`` new tokens (the user's message,
a tool's output). A session ends before a prompt and its answer would pass ``max_context``.

Prompts are rows of a hash-id trace (``workloads/prefix_trace.py``): one id per ``block_size``
tokens, equal ids equal blocks. A prompt's full blocks keep their ids in the next turn; its last,
partial block is filled by the next turn and so takes a new id there, as a trace hashed by content
records it; answers are new blocks (the simulator's answer tokens are placeholders). The requests
are made from the rows by the trace replay's own code, so the two read alike; ``rows()`` gives the
rows themselves (``write_trace`` saves them as a ``.jsonl`` trace).

The defaults are sized on Mooncake's conversation trace (kvcache-ai/Mooncake, FAST'25: 12,031
requests in an hour, a mean prompt of about 12,000 tokens, 512-token blocks, about 37 % of prompt
tokens reusable by an infinite cache, a session's next turn about two minutes after the last);
``tests/test_long_context.py`` checks the shape they give.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from itertools import count, islice
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvsched.core.request import Request
from kvsched.workloads.caps import CapModel, Capper, FixedCap
from kvsched.workloads.distributions import LengthDist, LogNormal, Uniform
from kvsched.workloads.prefix_trace import Row, trace_requests
from kvsched.workloads.sessions import in_arrival_order

MAX_CONTEXT = 1 << 20


class LongContextSpec(BaseModel):
    """Long-context sessions as block hashes (``--workload long-context``, or ``{"kind": "long-context", ...}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["long-context"] = "long-context"
    num_sessions: int = Field(6_000, ge=1, le=1_000_000)
    rate: float = Field(1.667, gt=0, le=1e6, description="sessions started per second (Poisson)")
    turns: LengthDist = Uniform(low=1, high=3)
    think_time_s: float = Field(120.0, gt=0, le=1e6, description="mean time between a session's turns (exponential)")
    system_prompts: int = Field(1, ge=1, le=10_000, description="distinct system prompts the sessions share")
    system_blocks: int = Field(1, ge=1, le=1_000, description="blocks of each system prompt")
    context: LengthDist = LogNormal(median=3_200, sigma=0.8, max=100_000)
    turn: LengthDist = LogNormal(median=7_600, sigma=0.8, max=100_000)
    output: LengthDist = LogNormal(median=250, sigma=0.8, max=4_096)
    max_context: int = Field(
        131_072, ge=2, le=MAX_CONTEXT, description="a session ends before a prompt and its answer would pass this"
    )
    block_size: int = Field(512, ge=1, le=1 << 16, description="prompt tokens per hash id (Mooncake: 512)")
    cap: CapModel = Field(
        FixedCap(), description="the max_tokens a client sends (workloads/caps.py); default: the longest output"
    )
    seed: int = 0

    def rows(self) -> Iterator[Row]:
        """``(arrival ms, input length, output length, hash ids, session id)`` per request, in arrival order."""
        return in_arrival_order(self._sessions(), lambda row: row[0])

    def _sessions(self) -> Iterator[tuple[float, Iterator[Row]]]:
        rng = random.Random(self.seed)
        new_ids = count(self.system_prompts * self.system_blocks)  # ids below are the system prompts'
        start = 0.0
        for s in range(self.num_sessions):
            start += rng.expovariate(self.rate)
            turns = self.turns.sample(rng)
            system = rng.randrange(self.system_prompts)
            yield start * 1000.0, self._session(s, start, turns, system, random.Random(rng.getrandbits(64)), new_ids)

    def _session(
        self, s: int, t: float, turns: int, system: int, rng: random.Random, new_ids: Iterator[int]
    ) -> Iterator[Row]:
        """One session's turns. New blocks take the next ids of ``new_ids``, which all sessions share (they
        are made in one order, the rows' own, so the ids are the same on every replay)."""
        full = list(range(system * self.system_blocks, (system + 1) * self.system_blocks))  # ids of the full blocks
        tail = 0  # tokens after them, in a block not yet full
        length, added = len(full) * self.block_size, self.context.sample(rng)
        for _ in range(turns):
            whole, tail = divmod(tail + added, self.block_size)
            full.extend(islice(new_ids, whole))
            length += added
            output = self.output.sample(rng)
            if length + output > self.max_context:
                return
            ids = full + [next(new_ids)] if tail else list(full)
            yield round(t * 1000.0, 3), length, output, ids, f"s{s}"
            t += rng.expovariate(1.0 / self.think_time_s)
            added = output + self.turn.sample(rng)

    def iter_requests(self) -> Iterator[Request]:
        return trace_requests(self.rows(), self.block_size, Capper(self.cap, self.output.upper, self.seed))

    def requests(self) -> list[Request]:
        return list(self.iter_requests())

    @property
    def num_requests(self) -> int:
        """How many turns the sessions send (counted by making them: a session's length depends on its draws)."""
        return sum(1 for _ in self.rows())

    def tenant_names(self) -> set[str]:
        return {"default"}

    def describe(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def write_trace(self, path: Path) -> None:
        """The rows as a ``.jsonl`` trace that ``--trace`` replays as these requests (given this spec's
        ``block_size`` as ``hash_block_size``, 512 by default in both, and its cap)."""
        with open(path, "w", encoding="utf-8") as out:
            for t, prompt, output, ids, session in self.rows():
                out.write(
                    json.dumps(
                        {
                            "timestamp": t,
                            "input_length": prompt,
                            "output_length": output,
                            "hash_ids": ids,
                            "session_id": session,
                        }
                    )
                    + "\n"
                )
