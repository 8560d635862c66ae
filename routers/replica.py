"""What a router's views read of a replica, declared once: the fleet simulator's replicas
(``cluster/replica.py``) and Ray Serve's (``integrations/ray/router.py``) both provide it, and
``routers/view.py`` reads nothing else of them (a router itself only ever sees the views)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from kvsched.routers.view import Signals


class InPrefill(NamedTuple):
    """Of the requests a router sent a replica, those whose first token has not come back (queued or in
    prefill), and their prompt tokens: Dynamo's active prefill load."""

    requests: int
    tokens: int


@runtime_checkable
class RoutedReplica(Protocol):
    """A replica behind a router: what it is, its reports as of a time, the router's own in-flight counts
    for it (and of those, the ones awaiting their first token), and the prefix blocks its cache holds now."""

    name: str
    role: str  # mixed, prefill or decode
    profile_name: str  # its cost profile
    policy_name: str  # its scheduling policy
    block_size: int  # tokens per KV block
    num_gpu_blocks: int
    in_flight_requests: int  # requests the router sent it that have not finished
    in_flight_tokens: int  # their prompt tokens

    def signals_as_of(self, t: float) -> Signals:
        """Its newest report true at ``t`` or before."""
        ...

    def in_prefill(self) -> InPrefill:
        """Of the requests in flight, those whose first token has not come back, and their prompt tokens."""
        ...

    def cached_prefix_blocks(self, hashes: list[int]) -> int:
        """Leading blocks of ``hashes`` (a prompt's full-block prefix hashes) that its GPU prefix cache holds now."""
        ...
