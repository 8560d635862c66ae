"""The Ray Serve request router (``integrations/ray/router.py``) against hostile bodies and a crowd of
cancelled requests, without a Ray cluster: Serve's own ``PendingRequest`` and ``RequestMetadata``,
the router built by Serve's constructor, and, for the replicas, stand-ins that carry a real
``ReplicaID`` (a ``RunningReplica`` needs a live actor; the router reads only the id).

A body it cannot take a prompt from (none, one of another shape, token ids past int64, messages
that are not a list) goes in Serve's own order, never raises; what it remembers of a request
lasts while Serve routes it, whatever happens to the request.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("ray.serve", reason="the ray extra is not installed (pip install 'kvsched[ray]')")

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata  # noqa: E402
from ray.serve._private.request_router.common import PendingRequest  # noqa: E402
from starlette.requests import Request as HttpRequest  # noqa: E402

from kvsched.integrations.ray import fleet as ray_fleet  # noqa: E402
from kvsched.integrations.ray.fleet import CompletionBody  # noqa: E402
from kvsched.integrations.ray.router import KvschedRequestRouter, ServeReplica, prompt_ids  # noqa: E402
from kvsched.routers.replica import RoutedReplica  # noqa: E402

DEPLOYMENT = DeploymentID(name="EngineServe", app_name="kvsched-fleet")
REPLICAS = [SimpleNamespace(replica_id=ReplicaID(unique_id=f"r{i}", deployment_id=DEPLOYMENT)) for i in range(3)]
_ids = iter(range(10**9))


def router(name="round-robin") -> KvschedRequestRouter:
    made = KvschedRequestRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    made.initialize_state(router=name)
    return made


def pending(body) -> PendingRequest:
    """A request as the fleet's ingress sends it (made inside an event loop: it holds a future)."""
    rid = f"i{next(_ids)}"
    return PendingRequest(
        args=[CompletionBody(body)], kwargs={}, metadata=RequestMetadata(request_id=rid, internal_request_id=rid)
    )


def ranks(answer) -> list[list[str]]:
    return [[r.replica_id.unique_id for r in rank] for rank in answer]


SERVES_ORDER = [["r0", "r1", "r2"]]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": [2**64]},
        {"prompt": [-(2**63) - 1]},
        {"prompt": [True, 1]},
        {"prompt": [1.5]},
        {"prompt": []},
        {"prompt": ""},
        {"prompt": {"a": 1}},
        {"prompt": [[2**70]]},
        {"messages": 5},
        {"messages": "hi"},
        {"messages": [5, None]},
        {"messages": [{"content": 5}]},
        {"messages": [{"content": [{"type": "image"}]}]},
        {},
        {"prompt": None},
    ],
)
def test_a_body_without_a_prompt_it_can_take_goes_in_serves_order(body):
    """Before: ``[2**64]`` raised pydantic's multi-line ValidationError out of the router, ``messages: 5`` a
    TypeError."""

    async def route():
        return await router().choose_replicas(REPLICAS, pending(body))

    assert ranks(asyncio.run(route())) == SERVES_ORDER


@pytest.mark.parametrize(
    "body, ids",
    [
        ({"prompt": [1000, 1001, 1002]}, [1000, 1001, 1002]),
        ({"prompt": [[7, 8], [9]]}, [7, 8]),
        ({"prompt": "ab"}, [97, 98]),
        ({"prompt": ["ab", "cd"]}, [97, 98]),
        ({"prompt": "\udc80"}, list("\udc80".encode("utf-8", "surrogatepass"))),
        (
            {
                "messages": [
                    {"role": "user", "content": "ab"},
                    {"content": [{"type": "text", "text": "c"}, {"type": "image"}]},
                ]
            },
            [97, 98, 99],
        ),
    ],
)
def test_the_prompt_is_its_token_ids_or_the_bytes_of_its_text(body, ids):
    assert prompt_ids(SimpleNamespace(args=[CompletionBody(body)], kwargs={})) == ids


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["prompt", "messages", "content", "text", "type", "x"]), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(body=st.dictionaries(st.sampled_from(["prompt", "messages", "model", "stream"]), JSON, max_size=3))
def test_no_body_makes_the_router_fail(body):
    ids = prompt_ids(SimpleNamespace(args=[CompletionBody(body)], kwargs={}))
    assert all(type(t) is int and -(2**63) <= t < 2**63 for t in ids)

    async def route():
        return await router().choose_replicas(REPLICAS, pending(body))

    answer = ranks(asyncio.run(route()))
    assert sorted(sum(answer, [])) == ["r0", "r1", "r2"]


def test_cancelled_requests_are_not_kept():
    """Before: the table of requests asked about kept every one cancelled before Serve sent it (2,000 of 2,000)."""
    made = router("prefix-affinity")

    async def crowd():
        for i in range(2000):
            request = pending({"prompt": [i, i + 1, i + 2]})
            await made.choose_replicas(REPLICAS, request)
            request.future.cancel()  # the client went away before a replica took it

    asyncio.run(crowd())
    assert len(made.asked) < 130


def test_a_request_is_forgotten_once_serve_says_it_completed():
    made = router("least-outstanding")

    async def serve():
        sent, refused = pending({"prompt": [1, 2, 3]}), pending({"prompt": [4, 5, 6]})
        for request in (sent, refused):
            await made.choose_replicas(REPLICAS, request)
        made.on_request_routed(sent, REPLICAS[0].replica_id, None)
        busy = made.replicas[REPLICAS[0].replica_id].in_flight_requests
        for request in (sent, refused):  # a refused dispatch completes without being routed
            made.on_request_completed(REPLICAS[0].replica_id, request.metadata.internal_request_id)
        return busy

    assert asyncio.run(serve()) == 1
    assert made.asked == {} and made.routed == {}
    assert all(r.in_flight_requests == 0 and r.in_flight_tokens == 0 for r in made.replicas.values())


@pytest.mark.parametrize("body", [b"5", b"[1, 2]", b"not json", b"[" * 5000 + b"]" * 5000])
def test_the_fleets_front_refuses_a_body_that_is_not_a_json_object(body):
    """Before: an AttributeError (or RecursionError) in the ingress, an HTTP 500."""

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    request = HttpRequest({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive)
    reply = asyncio.run(ray_fleet.Fleet.completions(None, request))  # refused before the replicas are used
    assert reply.status_code == 400 and json.loads(reply.body)["message"] == "the body must be a JSON object"


def test_a_router_that_fails_fails_the_request_with_its_error():
    """Not a routing task that dies (Serve logs it and goes on) and a request left waiting forever."""
    from kvsched.routers import RouterError, hookimpl

    class Breaks:
        name = "breaks"

        @hookimpl
        def route_request(self, request, replicas):
            raise SystemExit(0)

    async def route():
        request = pending({"prompt": [1, 2, 3]})
        answer = await router(Breaks).choose_replicas(REPLICAS, request)
        return answer, request.future.exception()

    answer, error = asyncio.run(route())
    assert ranks(answer) == SERVES_ORDER and isinstance(error, RouterError)
    assert str(error).startswith("router 'breaks' in route_request: raised SystemExit: 0 (at ")


def test_a_serve_replica_is_the_replica_routers_read():
    replica = ServeReplica(REPLICAS[0], router())
    assert isinstance(replica, RoutedReplica) and (replica.policy_name, replica.block_size) == (
        "?",
        router().block_size,
    )
