"""The soak (issue 36): random workloads through every built-in policy, alone or in a fleet behind every
built-in router (1-4 replicas, P/D pools, stale views, routed ahead or not), with async scheduling, ``n > 1``,
prefix caching and small pools drawn together; every step audits its allocator, every request ends once.

Thirty examples under the default and ``ci`` profiles, two hundred under ``nightly`` (tests/conftest.py).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched import Engine, EngineConfig
from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.core.view import group_of
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.testing.cluster import assert_cluster
from tests.test_async_sim import BUILT_IN, pressed_workloads
from tests.test_routers import BUILT_INS as ROUTERS  # noqa: F401  (the routers by name)

SHAPES = ("alone", "fleet", "p/d")


class Ended:
    """What an engine's steps (and steady runs) ended: the groups, in order."""

    def __init__(self) -> None:
        self.groups: list = []

    def __call__(self, report) -> None:
        self.groups += map(group_of, report.finished)

    on_steps = __call__


@settings(max_examples=max(8, settings.default.max_examples // 5))
@given(
    data=st.data(),
    policy=st.sampled_from(BUILT_IN),
    router=st.sampled_from(ROUTERS),
    shape=st.sampled_from(SHAPES),
    replicas=st.integers(1, 4),
    staleness=st.sampled_from([0.0, 0.01, 0.2]),
    lookahead=st.booleans(),
    async_scheduling=st.booleans(),
    caching=st.booleans(),
    blocks=st.integers(24, 160),
    block_size=st.sampled_from((4, 8, 16)),
)
def test_soak(
    data, policy, router, shape, replicas, staleness, lookahead, async_scheduling, caching, blocks, block_size
):
    requests = data.draw(pressed_workloads(n_max=1 if shape == "p/d" else 3))  # P/D runs one sequence a request
    settings_ = {
        "num_gpu_blocks": blocks,
        "block_size": block_size,
        "enable_prefix_caching": caching,
        "max_num_seqs": 16,
        "async_scheduling": async_scheduling,
        "audit_every_step": True,
    }
    if shape == "alone":  # as engine run does it: nothing retained, the steps' reports (and steady runs) observed
        ended, engine = Ended(), Engine(EngineConfig(**settings_), policy, SimulatedExecutor(), retain_finished=False)
        engine.run(requests, on_step=ended, in_order=True)
        assert sorted(g.request_id for g in ended.groups) == sorted(r.request_id for r in requests)
        assert engine.leaked_blocks == 0 and not engine.groups
        return
    groups = (
        [ReplicaGroup(count=replicas, policy=policy, settings=settings_)]
        if shape == "fleet"
        else [
            ReplicaGroup(count=max(1, replicas // 2), role="prefill", policy=policy, settings=settings_),
            ReplicaGroup(count=max(1, replicas - replicas // 2), role="decode", policy=policy, settings=settings_),
        ]
    )
    cluster = Cluster(FleetSpec(replicas=groups, router=router, staleness_s=staleness), lookahead=lookahead)
    cluster.run(requests)
    assert_cluster(cluster, requests)
