"""A workload replayed against a live OpenAI-compatible server over HTTP, timed from the client (``engine bench``).

Each request is sent at its arrival time (relative to the start) as a streaming completion with
the official ``openai`` client: its prompt as token ids (the workloads give lengths, so each
request gets ids of its own, and no two prompts share a prefix by accident), ``max_tokens`` its
output length and ``ignore_eos`` so that it generates exactly that many, as ``vllm bench serve
--ignore-eos`` does. The client measures what a user sees: time to the first token, the gaps
between tokens (ITL), time per output token after the first (TPOT) and end to end. The records
are ``RequestMetrics``, the simulation's schema; what only a scheduler knows (when it was first
scheduled, preemptions) stays empty.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.request import LABELS, Request
from kvsched.errors import error_text, quote, shorten
from kvsched.metrics.requests import RequestMetrics

VOCAB_START, VOCAB_SPAN = 1000, 30000  # token ids sent for length-only prompts: ordinary words in most vocabularies
FINISHED = ("stop", "length")  # the finish reasons of a request the server completed


def api_base(url: str) -> str:
    """The OpenAI API base of the server at ``url``, given as the base (``http://HOST:PORT/v1``) or, as
    ``vllm bench serve --base-url`` takes it, as the server's root (``http://HOST:PORT``)."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


@dataclass
class Sent:
    """One request as the client saw it (seconds from the start of the run)."""

    request: Request
    sent: float = 0.0
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None  # why it did not finish, in the server's words where it gave any
    refused: bool = False  # the server ended it before it ran (an HTTP error, an empty stream): ignored, not aborted

    def metrics(self) -> RequestMetrics:
        r, times = self.request, self.token_times
        done = self.error is None and self.finished is not None
        first = times[0] if times else None
        tpot = (
            (self.finished - first) / (self.output_tokens - 1)
            if done and first is not None and self.output_tokens > 1
            else None
        )
        if done:
            status = "FINISHED_STOPPED" if self.finish_reason == "stop" else "FINISHED_LENGTH_CAPPED"
        else:
            status = "FINISHED_IGNORED" if self.refused else "FINISHED_ABORTED"
        reason = self.finish_reason if done else ("length" if self.refused else "abort")  # vLLM's reasons for them
        return RequestMetrics(
            request_id=r.request_id,
            status=status,
            finish_reason=reason,
            detail=self.error,
            priority=r.priority,
            tenant=r.tenant,
            n=r.sampling.n,
            prompt_tokens=r.prompt_len,
            output_tokens=self.output_tokens,
            arrival_time=self.sent,
            first_scheduled_time=None,
            first_token_time=first,
            finish_time=self.finished,
            queueing_time=None,
            ttft=None if first is None else first - self.sent,
            tpot=tpot,
            e2e=self.finished - self.sent if done else None,
            preemptions_recompute=0,
            preemptions_swap=0,
            slo_class=r.slo_class,
            session_id=r.session_id,
        )

    @property
    def itls(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


def prompt_of(request: Request) -> list[int]:
    """The request's token ids, or ids of its own for a prompt given only by length. Ids no vocabulary
    need hold (``VOCAB_START + VOCAB_SPAN`` and up: a sessions workload's fresh ids, a hash-id trace's
    blocks; and negative ones, which ``Request`` takes and no server does) are folded into the span, equal ids alike, so
    the prefix sharing the workload records is what the server's cache sees (two different ids may meet; a whole shared
    block by chance hardly)."""
    if request.prompt_token_ids:
        end = VOCAB_START + VOCAB_SPAN
        return [
            t if 0 <= t < end else VOCAB_START + (t * 2654435761 >> 7) % VOCAB_SPAN for t in request.prompt_token_ids
        ]
    seed = zlib.crc32(request.request_id.encode()) % VOCAB_SPAN  # the same ids in every run
    return [VOCAB_START + (seed + 7919 * k) % VOCAB_SPAN for k in range(request.prompt_len)]


async def _send(client: Any, model: str, item: Sent, start: float, timeout: float) -> None:
    r = item.request
    extra: dict[str, Any] = {"ignore_eos": True}
    if r.priority:
        extra["priority"] = r.priority
    labels = {name: value for name in LABELS if (value := getattr(r, name)) != Request.model_fields[name].default}
    if labels:  # what a policy inside vLLM reads (integrations/vllm/mirror.py request_fields)
        extra["vllm_xargs"] = labels
    max_tokens = max_output(r)
    item.sent = time.perf_counter() - start
    reported = None
    try:
        stream = await client.completions.create(
            model=model,
            prompt=prompt_of(r),
            max_tokens=max_tokens,
            temperature=r.sampling.temperature,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        async for chunk in stream:
            now = time.perf_counter() - start
            for choice in chunk.choices:
                # a chunk per step's new tokens, counted even when its text is empty (the detokenizer
                # holds back a partial UTF-8 character), as vllm bench serve counts it
                item.token_times.append(now)
                if choice.finish_reason:
                    item.finish_reason = choice.finish_reason
            if chunk.usage is not None:
                reported = chunk.usage.completion_tokens
        item.finished = time.perf_counter() - start
        item.error = _refused(item, reported, max_tokens)
    except Exception as exc:  # a request the server failed is a result, not a crash of the benchmark
        item.finished = time.perf_counter() - start
        item.error, item.refused = _failure(exc, item, timeout)


def max_output(request: Request) -> int:
    """The tokens a request asks the server for: its recorded output length (else its sampling cap)."""
    return request.output_len or request.sampling.max_tokens


def _failure(exc: Exception, item: Sent, timeout: float) -> tuple[str, bool]:
    """Why a request failed, in the server's words where it gave any, and whether the server refused it
    before it ran (an HTTP error status: a prompt past its context, a field it does not take)."""
    from openai import APIStatusError, APITimeoutError

    after = f" after {len(item.token_times)} streamed chunk(s)" if item.token_times else ""
    if isinstance(exc, APIStatusError):
        said = error_text(exc, 300).removeprefix(f"Error code: {exc.status_code} - ")
        return shorten(f"refused by the server (HTTP {exc.status_code}): {said}", 300), True
    if isinstance(exc, APITimeoutError):
        return f"the server sent nothing for {timeout:g} s (--timeout){after}", False
    return shorten(f"the connection failed{after}: {type(exc).__name__}: {error_text(exc, 300)}", 300), False


def _refused(item: Sent, reported: object, max_tokens: int) -> str | None:
    """Take the server's token count (else the chunks streamed) if it can be true; else why the request counts
    as failed: a figure the server made up must not reach the results (a negative throughput, an overflow)."""
    count = len(item.token_times) if reported is None else reported
    if not item.token_times and item.finish_reason is None and reported == 0:
        # vLLM streams no chunk for a request that ends without a token (it drops empty chunks, finish reason
        # and all), only the usage: what its scheduler does with a request it can never run
        item.refused = True
        return (
            f"the server ended it without a token or a finish reason (its scheduler could not run it: a prompt of "
            f"{item.request.prompt_len} tokens past what one step or the KV cache takes)"
        )
    if item.finish_reason not in FINISHED:
        return f"the stream ended with finish reason {item.finish_reason!r}, not {' or '.join(FINISHED)}"
    least = 1 if item.token_times else 0  # a streamed chunk carries a token
    if type(count) is not int or not least <= count <= max_tokens:
        return (
            f"the server reported {quote(count)} completion tokens for a request of at most {max_tokens} "
            f"({len(item.token_times)} chunks streamed)"
        )
    item.output_tokens = count
    return None


def _client_timeout(timeout: float):
    """Each wait on the server (connecting, sending, every read of the stream) ends after ``timeout``
    seconds: a server that sends its headers and then nothing fails the request, not the run. The wait
    for a free connection is the client's own (requests in flight past the pool's size queue there)."""
    from openai import Timeout

    return Timeout(timeout, pool=None)


async def _replay(
    url: str, model: str, requests: list[Request], api_key: str, on_done: Callable[[Sent], None] | None, timeout: float
) -> list[Sent]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=api_base(url), api_key=api_key, max_retries=0, timeout=_client_timeout(timeout))
    items = [Sent(r) for r in sorted(requests, key=lambda r: r.arrival_time)]
    start = time.perf_counter()

    async def one(item: Sent) -> None:
        delay = item.request.arrival_time - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        await _send(client, model, item, start, timeout)
        if on_done is not None:
            on_done(item)

    try:
        await asyncio.gather(*(one(item) for item in items))
    finally:
        await client.close()
    return items


def replay(
    url: str,
    model: str,
    requests: list[Request],
    api_key: str = "EMPTY",
    on_done: Callable[[Sent], None] | None = None,
    *,
    timeout: float,
) -> list[Sent]:
    """Send every request at its arrival time to the server at ``url`` (``api_base``); the records, in arrival order."""
    return asyncio.run(_replay(url, model, requests, api_key, on_done, timeout))


@dataclass(frozen=True)
class Served:
    """What the server says of itself before a replay: the model to request and its context (None if not told)."""

    model: str
    max_model_len: int | None


def served(url: str, api_key: str = "EMPTY", model: str | None = None, *, timeout: float) -> Served:
    """The server's model ``model`` (default: the first it lists) and its context length (vLLM lists it)."""
    from openai import OpenAI

    with OpenAI(base_url=api_base(url), api_key=api_key, max_retries=0, timeout=_client_timeout(timeout)) as client:
        models = client.models.list().data
    if not models:
        raise ValueError(f"the server at {url} lists no model")
    chosen = next((m for m in models if m.id == model), None) if model else models[0]
    if chosen is None:
        return Served(model, None)  # a model it does not list: its answer to the requests says more
    length = (chosen.model_extra or {}).get("max_model_len")
    return Served(chosen.id, length if type(length) is int and length > 0 else None)


def misfits(requests: list[Request], max_model_len: int | None) -> str | None:
    """What to say before a replay of ``requests`` whose prompt and output pass the server's context (None if all fit):
    the server refuses each of them."""
    if max_model_len is None:
        return None
    over = [r for r in requests if r.prompt_len + max_output(r) > max_model_len]
    if not over:
        return None
    worst = max(over, key=lambda r: r.prompt_len + max_output(r))
    return (
        f"{len(over):,} of {len(requests):,} requests need more than the server's context of {max_model_len:,} "
        f"tokens (prompt + output; {worst.request_id}: {worst.prompt_len:,} + {max_output(worst):,}): "
        "the server will refuse them"
    )


def measured(
    url: str, model: str, load: Any, sent: list[Sent], label: str | None = None
) -> tuple[list[RequestMetrics], dict]:
    """The records and summary of ``load`` replayed (``sent``), as a simulation's: what ``engine bench``
    writes and ``engine leaderboard --real`` ranks beside the simulated policies."""
    from kvsched.metrics.requests import distribution, summarize

    metrics = [s.metrics() for s in sent]
    description = load.describe()
    summary = summarize(
        None,
        metrics,
        policy=label or url,
        profile=f"measured at {url}",
        seed=description.get("seed"),
        workload=description,
        server={"url": url, "model": model},
        itl_s=distribution([gap for s in sent for gap in s.itls]),
    )
    return metrics, summary
