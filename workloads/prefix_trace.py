"""Traces with prefix structure: JSON lines of ``timestamp``, ``input_length``, ``output_length``, ``hash_ids``.

The format of Mooncake's published traces (kvcache-ai/Mooncake, ``FAST25-release/traces/``) and of
the tools built on them: one request per line, ``timestamp`` in milliseconds, and one hash id per
``hash_block_size`` prompt tokens (512 in Mooncake's), equal ids meaning equal blocks. The ids carry
no text, so each block's tokens are made from its id: block ``h`` is ``h * B, h * B + 1, ...``
(B = ``hash_block_size``), the last block cut to the prompt's length; a request keeps its prompt as
the ids (``BlockPrompt``), and the tokens are made only where they are read. Two prompts then share exactly
the leading blocks whose ids they share, and the engine's prefix cache sees the trace's sharing, at
any engine block size. A line may also give ``session_id`` (for session-aware policies).

The file is read one line at a time (requests are made as the engine asks for them); every line is
validated, and the first bad value raises ``WorkloadError`` with the file, line and key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvsched.core.request import MAX_INT64, MAX_TOKENS, BlockPrompt, Request, SamplingParams
from kvsched.errors import quote
from kvsched.userfiles.reader import text_lines
from kvsched.workloads.caps import CapModel, Capper, FixedCap
from kvsched.workloads.errors import MAX_PROMPT_IDS, MAX_REQUESTS, WorkloadError

KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


def _count(value, key: str, path, line: int, minimum: int = 1, maximum: int = MAX_TOKENS) -> int:
    if type(value) is not int or not minimum <= value <= maximum:
        raise WorkloadError(f"must be an integer from {minimum} to {maximum:,}, got {quote(value)}", path, line, key)
    return value


def read_prefix_trace(
    path: Path | str, hash_block_size: int = 512
) -> Iterator[tuple[float, int, int, list[int], str | None]]:
    """``(arrival ms, input length, output length, hash ids, session id)`` per line, in file order."""
    last = -math.inf
    seen = False
    for line, text in enumerate(text_lines(path, "trace"), start=1):
        if not text.strip():
            raise WorkloadError("empty line", path, line)
        try:
            row = json.loads(text)
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            raise WorkloadError(f"not a JSON object: {getattr(exc, 'msg', exc)}", path, line) from None
        if not isinstance(row, dict):
            raise WorkloadError(f"expected a JSON object with {', '.join(KEYS)}, got {quote(row)}", path, line)
        missing = [k for k in KEYS if k not in row]
        if missing:
            raise WorkloadError(f"missing key(s) {', '.join(missing)}", path, line)
        t = row["timestamp"]
        if type(t) not in (int, float) or not math.isfinite(t) or t < 0:
            raise WorkloadError(f"must be a finite time in ms >= 0, got {quote(t)}", path, line, "timestamp")
        if t < last:
            raise WorkloadError(
                f"timestamp {t} precedes the previous line's {last}: lines must be in time order",
                path,
                line,
                "timestamp",
            )
        last = t
        prompt = _count(row["input_length"], "input_length", path, line, maximum=MAX_PROMPT_IDS)  # made as token ids
        output = _count(row["output_length"], "output_length", path, line)
        ids = row["hash_ids"]
        if not isinstance(ids, list) or any(type(h) is not int or h < 0 for h in ids):
            raise WorkloadError(f"must be a list of integers >= 0, got {quote(ids)}", path, line, "hash_ids")
        blocks = -(-prompt // hash_block_size)
        if len(ids) != blocks:
            raise WorkloadError(
                f"{len(ids)} hash ids for {prompt} tokens: expected {blocks} (one per {hash_block_size}-token block)",
                path,
                line,
                "hash_ids",
            )
        if max(ids, default=0) > MAX_INT64 // hash_block_size - 1:
            raise WorkloadError(f"a hash id too large to make token ids of: {max(ids)}", path, line, "hash_ids")
        session = row.get("session_id")
        if session is not None and (
            not isinstance(session, (str, int)) or isinstance(session, bool) or not str(session).strip()
        ):
            raise WorkloadError(
                f"must be a non-empty string or integer, got {quote(session)}", path, line, "session_id"
            )
        seen = True
        yield t, prompt, output, ids, None if session is None else str(session)
    if not seen:
        raise WorkloadError("no requests: the file is empty", path, 1)


Row = tuple[float, int, int, list[int], "str | None"]  # (arrival ms, input length, output length, hash ids, session id)


def trace_requests(
    rows: Iterable[Row], hash_block_size: int, capper: Capper, rate_scale: float = 1.0
) -> Iterator[Request]:
    """The requests of a trace's rows, made one at a time: arrivals counted from the first row (in
    seconds, divided by ``rate_scale``), each prompt kept as its hash ids (``BlockPrompt``), each answer capped."""
    start = None
    params: dict[int, SamplingParams] = {}
    for i, (t, prompt, output, ids, session) in enumerate(rows):
        start = t if start is None else start
        cap, output = capper(output)
        sp = params.get(cap) or params.setdefault(cap, SamplingParams(max_tokens=cap))
        yield Request(
            request_id=f"req-{i}",
            prompt_token_ids=BlockPrompt(ids, prompt, hash_block_size),
            output_len=output,
            sampling=sp,
            arrival_time=round((t - start) / 1000.0 / rate_scale, 6),
            session_id=session,
        )


def reusable_share(rows: Iterable[Row], hash_block_size: int) -> float:
    """The share of all prompt tokens an infinite prefix cache could serve: each prompt's leading
    blocks that some earlier prompt had (at the same place, after the same blocks), over all tokens."""
    seen: set[int] = set()  # each prefix seen, as a chained hash of its ids
    reusable = total = 0
    for _, prompt, _, ids, _ in rows:
        total += prompt
        key, matched = None, True
        for j, h in enumerate(ids):
            key = hash((key, h))
            if matched and key in seen:
                reusable += min(hash_block_size, prompt - j * hash_block_size)
            else:
                matched = False
                seen.add(key)
    return reusable / total if total else 0.0


class PrefixTraceWorkload(BaseModel):
    """A JSON-lines trace with hash ids, replayed at its timestamps (``rate_scale`` divides them)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["prefix-trace"] = "prefix-trace"
    path: Path
    # at most 4,096 tokens an id: what a line of the file can ask the workload to make stays bounded by its length
    hash_block_size: int = Field(512, ge=1, le=4096, description="prompt tokens per hash id (Mooncake: 512)")
    rate_scale: float = Field(1.0, gt=0)
    max_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    cap: CapModel = Field(
        FixedCap(), description="the max_tokens a client sends (workloads/caps.py); default: the longest answer"
    )
    seed: int = 0

    def _rows(self):
        for i, row in enumerate(read_prefix_trace(self.path, self.hash_block_size)):
            if self.max_requests is not None and i >= self.max_requests:
                return
            yield row

    def iter_requests(self) -> Iterator[Request]:
        # the default cap is the whole file's longest answer: a pass of its own, made only for it (a given cap streams
        # at once)
        default = isinstance(self.cap, FixedCap) and self.cap.tokens is None
        capper = Capper(
            self.cap,
            max(row[2] for row in read_prefix_trace(self.path, self.hash_block_size)) if default else 0,
            self.seed,
        )
        yield from trace_requests(self._rows(), self.hash_block_size, capper, self.rate_scale)

    def requests(self) -> list[Request]:
        return list(self.iter_requests())

    @property
    def num_requests(self) -> int:
        return sum(1 for _ in self._rows())

    def tenant_names(self) -> set[str]:
        return {"default"}

    def describe(self) -> dict:
        return self.model_dump(mode="json")


def prefix_trace(
    path: Path, num_requests: int | None, rate_scale: float, seed: int, other_options
) -> PrefixTraceWorkload:
    """``--trace FILE.jsonl``: Mooncake's 512-token hash blocks (a spec file sets ``hash_block_size``)."""
    if other_options:
        raise WorkloadError(
            "a .jsonl trace replays its own timestamps: --rate, --arrival, --start-offset and "
            "--max-total-tokens do not apply (--rate-scale and --num-requests do)",
            path,
        )
    return PrefixTraceWorkload(path=path, rate_scale=rate_scale, max_requests=num_requests, seed=seed)


def prefix_spec(data: dict, spec_path: Path, num_requests: int | None, rate_scale: float) -> PrefixTraceWorkload:
    """A ``{"kind": "prefix-trace", "path": ..., "hash_block_size": ...}`` spec; its path is relative to the spec
    file."""
    data = dict(data)
    if isinstance(data.get("path"), str):
        data["path"] = str((spec_path.parent / data["path"]).resolve())
    try:
        spec = PrefixTraceWorkload.model_validate(data)
        update = {"rate_scale": spec.rate_scale * rate_scale}
        if num_requests is not None:
            update["max_requests"] = num_requests
        return PrefixTraceWorkload.model_validate({**spec.model_dump(), **update})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise WorkloadError(f"invalid workload spec: {field}: {first['msg']}", spec_path) from None
