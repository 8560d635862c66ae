"""A kvsched router (any ``kvsched.routers`` plugin) as Ray Serve's request router.

Ray Serve calls ``choose_replicas`` with its running replicas and the pending request; this class
shows each replica to the kvsched router as a ``ReplicaView``, exactly as the cluster simulator
does, through the same validated ``RouterHooks`` (a bad choice is a ``RouterError`` naming the
router), and returns the router's choice first, the other replicas after it (Ray falls back to them
only if the choice is full). What a Serve replica can report differs from a simulated one:

- ``num_running`` is Serve's own count of the replica's ongoing requests (its queue-length cache,
  probed by Serve); waiting and swapped are 0, KV usage 0 and its prefix cache unknown (no probe:
  ``cached_prefix_tokens`` is 0), so cache-probing routers see no hits and fall back to their ties;
- in-flight counts are this router's own (requests it routed whose response has not ended);
- the prompt is the request's token ids when it gives a token list, else the UTF-8 bytes of its
  text (or of its messages' contents), so that prefix tables compare characters, as Ray's own
  ``PrefixCacheAffinityRouter`` does. A body with no prompt a ``Request`` can hold (none, one of
  another shape, token ids past int64) goes in Serve's own order, to a server that answers it in
  its own words; the router itself never fails on a body.

A router that fails (a ``RouterError``: it raised, or chose what it was not given) fails the request
it was asked about, with that error; Serve's routing task would otherwise die and leave the
request waiting forever. What it remembers of a request lasts while Serve routes it: one cancelled before a replica took
it is forgotten (Serve tells a router nothing then: the table is swept of them as it grows), one
dispatched is forgotten when Serve says it completed.

Configured as a deployment's ``RequestRouterConfig(request_router_class=
"kvsched.integrations.ray.router:KvschedRequestRouter", request_router_kwargs={"router": NAME,
"router_options": {...}})``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from kvsched.core.request import MAX_INT64, Request
from kvsched.routers.plugins import RouterError, RouterHooks
from kvsched.routers.replica import InPrefill
from kvsched.routers.view import Signals


class ServeReplica:
    """One Serve replica as the kvsched router's views read it (``routers/replica.py``'s ``RoutedReplica``)."""

    num_gpu_blocks = 1  # Serve reports no KV blocks: shown as one, free (usage 0)

    def __init__(self, replica: RunningReplica, router: KvschedRequestRouter) -> None:
        self.replica, self.router = replica, router
        self.name = replica.replica_id.unique_id
        self.role, self.profile_name = "mixed", "ray-serve"
        self.policy_name, self.block_size = "?", router.block_size
        self.in_flight_requests = 0
        self.in_flight_tokens = 0

    def signals_as_of(self, t: float) -> Signals:
        ongoing = self.router.replica_queue_len_cache.get(self.replica.replica_id)
        return Signals(t, 0, ongoing or 0, 0, 1)

    def cached_prefix_blocks(self, hashes: list[int]) -> int:
        return 0

    def in_prefill(self) -> InPrefill:
        """Serve tells a router when a request completes, not when its first token comes: every request in
        flight counts as awaiting it."""
        return InPrefill(self.in_flight_requests, self.in_flight_tokens)


def prompt_ids(pending: PendingRequest) -> list[int]:
    """The token ids of a pending request's prompt (see the module's note); empty if it has none."""
    for arg in (*pending.args, *pending.kwargs.values()):
        try:
            body = arg if isinstance(arg, dict) else getattr(arg, "body", None)  # a CompletionBody: the body itself
            if not isinstance(body, dict):
                body = vars(arg) if hasattr(arg, "__dict__") else {}
            prompt = body.get("prompt")
            if prompt is None and isinstance(body.get("messages"), list):
                prompt = "".join(_texts(body["messages"]))
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
                prompt = prompt[0]  # a batch of prompts: its first decides
            if isinstance(prompt, list) and all(type(t) is int and -MAX_INT64 - 1 <= t <= MAX_INT64 for t in prompt):
                return prompt
            if isinstance(prompt, str):
                return list(prompt.encode("utf-8", "surrogatepass"))
        except Exception:  # an argument that is no body: the next one may be
            continue
    return []


def _texts(messages: list) -> Iterator[str]:
    """The text of chat messages: each one's ``content``, a string or a list of parts (OpenAI's ``{"type":
    "text", "text": ...}``); what is neither adds nothing."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            yield from (p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


class KvschedRequestRouter(RequestRouter):
    """Ray Serve's ``RequestRouter`` that asks a kvsched router plugin (``router``) for each request."""

    def initialize_state(
        self, router: str = "prefix-affinity", router_options: dict[str, Any] | None = None, block_size: int = 16
    ) -> None:
        self.hooks = RouterHooks(router, router_options)
        self.block_size = block_size
        self.replicas: dict[ReplicaID, ServeReplica] = {}
        self.asked: dict[
            str, tuple[Request, PendingRequest]
        ] = {}  # internal request id -> (as routed, as Serve has it)
        self.routed: dict[
            str, tuple[Request, ServeReplica]
        ] = {}  # internal request id -> what it was and where it went
        self.sweep_at = 64  # the size of ``asked`` at which cancelled requests are swept from it
        self.start = time.monotonic()

    def _replica(self, replica: RunningReplica) -> ServeReplica:
        found = self.replicas.get(replica.replica_id)
        if found is None or found.replica is not replica:
            found = self.replicas[replica.replica_id] = ServeReplica(replica, self)
        return found

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        ids = prompt_ids(pending_request)
        try:
            request = Request(request_id=pending_request.metadata.internal_request_id, prompt_token_ids=tuple(ids))
        except ValidationError:  # no prompt (a health check, a method), or none a Request holds: Serve's order
            return [candidate_replicas]
        replicas = [self._replica(r) for r in candidate_replicas]
        try:
            chosen, _reason = self.hooks.route(request, replicas, time.monotonic() - self.start, 0.0)
        except RouterError as exc:  # the request's answer, not a routing task that dies and leaves it waiting forever
            if not pending_request.future.done():
                pending_request.future.set_exception(exc)
            return [candidate_replicas]
        self._forget_cancelled()
        self.asked[request.request_id] = (request, pending_request)  # on_request_routed records it, once Serve sends it
        return [[chosen.replica], [r.replica for r in replicas if r is not chosen]]

    def _forget_cancelled(self) -> None:
        """Sweep the requests cancelled before Serve sent them from ``asked``, once it has grown to
        twice what the last sweep left (or 64): it holds about the requests being routed, no more."""
        if len(self.asked) >= self.sweep_at:
            self.asked = {rid: entry for rid, entry in self.asked.items() if not entry[1].future.cancelled()}
            self.sweep_at = max(64, 2 * len(self.asked))

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        request, _ = self.asked.pop(pending_request.metadata.internal_request_id, (None, None))
        replica = self.replicas.get(replica_id)
        if request is None or replica is None:
            return
        replica.in_flight_requests += 1
        replica.in_flight_tokens += request.prompt_len
        self.routed[pending_request.metadata.internal_request_id] = (request, replica)
        self.hooks.routed(request, replica, time.monotonic() - self.start)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        found = self.routed.pop(internal_request_id, None)
        if found is None:  # dispatched but never routed (a replica that refused it: asked again if retried)
            self.asked.pop(internal_request_id, None)
            return
        request, replica = found
        replica.in_flight_requests -= 1
        replica.in_flight_tokens -= request.prompt_len
        self.hooks.finished(request, replica, time.monotonic() - self.start)
