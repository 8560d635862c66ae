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
  ``PrefixCacheAffinityRouter`` does.

Configured as a deployment's ``RequestRouterConfig(request_router_class=
"kvsched.integrations.ray.router:KvschedRequestRouter", request_router_kwargs={"router": NAME,
"router_options": {...}})``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from kvsched.core.request import Request
from kvsched.routers.plugins import RouterHooks
from kvsched.routers.view import Signals


class ServeReplica:
    """One Serve replica as the kvsched router's views read it (the attributes a cluster replica has)."""

    num_gpu_blocks = 1  # Serve reports no KV blocks: shown as one, free (usage 0)

    def __init__(self, replica: RunningReplica, router: KvschedRequestRouter) -> None:
        self.replica, self.router = replica, router
        self.name = replica.replica_id.unique_id
        self.role, self.profile_name = "mixed", "ray-serve"
        self.engine = SimpleNamespace(policy_name="?", config=SimpleNamespace(block_size=router.block_size, num_gpu_blocks=1))
        self.in_flight_requests = 0
        self.in_flight_tokens = 0

    def signals_as_of(self, t: float) -> Signals:
        ongoing = self.router.replica_queue_len_cache.get(self.replica.replica_id)
        return Signals(t, 0, ongoing or 0, 0, 1)

    def cached_prefix_blocks(self, hashes: list[int]) -> int:
        return 0


def prompt_ids(pending: PendingRequest) -> list[int]:
    """The token ids of a pending request's prompt (see the module's note); empty if it has none."""
    for arg in list(pending.args) + list(pending.kwargs.values()):
        body = arg if isinstance(arg, dict) else getattr(arg, "body", None)  # the fleet's CompletionBody: the JSON body itself
        if not isinstance(body, dict):
            body = getattr(arg, "__dict__", {})
        prompt = body.get("prompt", getattr(arg, "prompt", None))
        if prompt is None and body.get("messages", getattr(arg, "messages", None)):
            prompt = "".join(str(m.get("content", "")) if isinstance(m, dict) else str(getattr(m, "content", "")) for m in body.get("messages") or arg.messages)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # a batch of prompts: its first decides
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        if isinstance(prompt, str):
            return list(prompt.encode())
    return []


class KvschedRequestRouter(RequestRouter):
    """Ray Serve's ``RequestRouter`` that asks a kvsched router plugin (``router``) for each request."""

    def initialize_state(self, router: str = "prefix-affinity", router_options: dict[str, Any] | None = None, block_size: int = 16) -> None:
        self.hooks = RouterHooks(router, router_options)
        self.block_size = block_size
        self.replicas: dict[ReplicaID, ServeReplica] = {}
        self.asked: dict[str, Request] = {}  # internal request id -> the request as the router saw it
        self.routed: dict[str, tuple[Request, ServeReplica]] = {}  # internal request id -> what it was and where it went
        self.start = time.monotonic()

    def _replica(self, replica: RunningReplica) -> ServeReplica:
        found = self.replicas.get(replica.replica_id)
        if found is None or found.replica is not replica:
            found = self.replicas[replica.replica_id] = ServeReplica(replica, self)
        return found

    async def choose_replicas(self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas]
        ids = prompt_ids(pending_request)
        if not ids:  # a call with no prompt (a health check, a method of the deployment): Serve's order
            return [candidate_replicas]
        request = Request(request_id=pending_request.metadata.internal_request_id, prompt_token_ids=tuple(ids))
        replicas = [self._replica(r) for r in candidate_replicas]
        chosen, _reason = self.hooks.route(request, replicas, time.monotonic() - self.start, 0.0)
        self.asked[request.request_id] = request  # what on_request_routed records, once Serve sends it
        return [[chosen.replica], [r.replica for r in replicas if r is not chosen]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        request = self.asked.pop(pending_request.metadata.internal_request_id, None)
        replica = self.replicas.get(replica_id)
        if request is None or replica is None:
            return
        replica.in_flight_requests += 1
        replica.in_flight_tokens += request.prompt_len
        self.routed[pending_request.metadata.internal_request_id] = (request, replica)
        self.hooks.routed(request, replica, time.monotonic() - self.start)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        found = self.routed.pop(internal_request_id, None)
        if found is None:
            return
        request, replica = found
        replica.in_flight_requests -= 1
        replica.in_flight_tokens -= request.prompt_len
        self.hooks.finished(request, replica, time.monotonic() - self.start)
