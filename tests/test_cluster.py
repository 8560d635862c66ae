"""The cluster simulator: one replica behind a router is the engine itself; any fleet, router,
staleness and P/D split keeps the fleet's invariants (Hypothesis); P/D charges the KV transfer and
takes TTFT from the prefill pool; heterogeneous fleets from a spec; ``engine run --replicas`` end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from kvsched.cluster import Cluster, FleetError, FleetSpec, KvTransfer, ReplicaGroup, load_fleet, run_cluster
from kvsched.cluster.summary import fleet_summary
from kvsched.core.request import MAX_TOKENS, Request, SamplingParams
from kvsched.executors.cost_model import MAX_KV_BYTES_PER_TOKEN
from kvsched.experiments.simulation import run_simulation
from kvsched.metrics.records import row_of
from kvsched.metrics.requests import FIELDS
from kvsched.routers import hookimpl
from kvsched.testing.cluster import assert_cluster, check_cluster
from kvsched.workloads.sessions import SessionSpec
from tests.test_engine_events import by_engine_run
from tests.test_routers import BUILT_INS, registered  # noqa: F401  (the routers by name, installed or declared)

ROOT = Path(__file__).resolve().parents[1]
ENGINE = str(Path(sys.executable).parent / "engine")  # the console script beside the interpreter running the tests
WIDE = {**__import__("os").environ, "COLUMNS": "200"}  # the tables unwrapped
SMALL = {
    "num_gpu_blocks": 64,
    "block_size": 16,
    "max_num_batched_tokens": 1024,
    "max_model_len": 1024,
    "audit_every_step": True,
}


def req(rid: str, prompt_len: int, output_len: int, arrival: float, tokens=None) -> Request:
    prompt = {"prompt_token_ids": tuple(tokens)} if tokens is not None else {"prompt_len": prompt_len}
    return Request(
        request_id=rid,
        **prompt,
        output_len=output_len,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=output_len),
    )


ASYNC = {"async_scheduling": True}


@pytest.mark.parametrize(
    ("policy", "timing"),
    [
        ("vllm-default", {}),
        ("vllm-default", ASYNC),
        ("vllm-v1", ASYNC),
        ("vllm-v1", {**ASYNC, "scheduler_ms": 2.0}),
        ("fcfs", {"scheduler_ms": 1.0}),
    ],
    ids=["sync", "async", "v1 async", "v1 async, scheduler_ms", "fcfs, scheduler_ms"],
)
def test_one_replica_behind_a_router_is_the_engine_itself(policy, timing):
    """Same requests, same records in the same order (then the fleet's own columns), whether Engine.run replays
    them or a one-replica fleet behind a router does (steady runs taken in both where the steps are not timed).
    Before, under async scheduling every record differed (a replica queued a request arriving mid-step at once)."""
    from kvsched.core.config import EngineConfig

    requests = [req(f"r{i}", 50 + 37 * i % 400, 5 + 11 * i % 90, 0.02 * i) for i in range(120)]
    settings_ = {"num_gpu_blocks": 128, "max_num_batched_tokens": 4096, "max_model_len": 4096, **timing}
    _, records = by_engine_run(requests, policy, EngineConfig(**settings_))  # the settings a profile fills, given
    alone = run_simulation(requests, policy, EngineConfig(**settings_))  # engine run's: the fleet of one, no router
    assert alone.requests == records
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(policy=policy, settings=settings_)]))
    fleet = cluster.run(requests)
    assert [row[: len(FIELDS)] for row in fleet.rows] == [row_of(m) for m in records]
    assert {row[len(FIELDS) :] for row in fleet.rows} == {(0, 0, 0)}  # replica 0 ran all, no prefix caching
    summary = fleet_summary(cluster)  # the recompute tax too (before: null in a fleet's summary)
    assert summary["recompute"] == alone.summary["recompute"] and summary["recompute"]["recomputed_tokens"] > 0


TIMINGS = [{}, {"scheduler_ms": 1.0}, ASYNC, {**ASYNC, "scheduler_ms": 2.0}]


@settings(max_examples=25)
@given(
    specs=st.lists(st.tuples(st.integers(1, 700), st.integers(1, 120), st.floats(0, 0.1)), min_size=1, max_size=40),
    policy=st.sampled_from(["vllm-default", "vllm-v1", "fcfs"]),
    timing=st.sampled_from(TIMINGS),
)
def test_a_one_replica_fleet_is_the_engine_sync_or_async(specs, policy, timing):
    """Same records, with the scheduler's time charged or not, synchronous or async. Before: under async scheduling
    a replica queued a request arriving mid-step at once, where the engine's next step, scheduled as the last began,
    had not seen it (every record differed)."""
    from kvsched.core.config import EngineConfig

    t, requests = 0.0, []
    for i, (prompt, output, gap) in enumerate(specs):
        t += gap
        requests.append(req(f"r{i}", prompt, output, t))
    settings_ = {**SMALL, **timing}  # every setting a replica's profile would fill given: equal configs
    _, records = by_engine_run(requests, policy, EngineConfig(**settings_))
    fleet = run_cluster(requests, FleetSpec(replicas=[ReplicaGroup(policy=policy, settings=settings_)]))
    assert [row[: len(FIELDS)] for row in fleet.rows] == [row_of(m) for m in records]


class FewestInFlight:
    """Routes to the replica with the fewest requests in flight, noting the counts each call saw."""

    name = "fewest-in-flight"

    def __init__(self):
        self.calls: list[tuple[float, tuple[int, ...]]] = []
        self.sent: list[tuple[str, str]] = []

    @hookimpl
    def route_request(self, request, replicas):
        self.calls.append((request.arrival_time, tuple(view.in_flight_requests for view in replicas)))
        return min(replicas, key=lambda view: (view.in_flight_requests, view.index))

    @hookimpl
    def on_routed(self, request, replica):
        self.sent.append((request.request_id, replica.name))


@pytest.mark.parametrize("timing", TIMINGS[:2], ids=["no scheduler time", "scheduler_ms"])
def test_a_request_counts_toward_its_replica_until_it_ends(timing):
    """A router sees each request in flight on its replica from its routing until the step that ends it ends.
    Before: a step's end event came at the executor's time, before the scheduler's was added, and released its
    requests that much early (a router choosing by load chose otherwise)."""
    requests = [req(f"r{i}", 40 + 97 * i % 300, 3 + 7 * i % 20, 0.004 * i) for i in range(60)]
    router = FewestInFlight()
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(count=3, settings={**SMALL, **timing})], router=router))
    cluster.run(requests)
    assert_cluster(cluster, requests)
    ends = {row.request_id: row.finish_time for row in cluster.records.named_rows()}
    for k, (arrival, counts) in enumerate(router.calls):
        ongoing = [name for rid, name in router.sent[:k] if ends[rid] > arrival]  # routed before, not ended by then
        assert counts == tuple(ongoing.count(r.name) for r in cluster.replicas)


requests_strategy = st.lists(
    st.tuples(st.integers(1, 700), st.integers(1, 120), st.floats(0, 0.3), st.integers(0, 3), st.integers(0, 40)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=25)
@given(
    specs=requests_strategy,
    router=st.sampled_from(BUILT_INS),
    replicas=st.integers(1, 4),
    staleness=st.sampled_from([0.0, 0.01, 0.05, 0.2]),
    split=st.one_of(st.none(), st.tuples(st.integers(1, 2), st.integers(1, 2))),
    caching=st.booleans(),
    policy=st.sampled_from(["vllm-default", "vllm-v1", "sarathi"]),
    timing=st.sampled_from(TIMINGS),
)
def test_any_fleet_loses_no_request_duplicates_none_and_leaks_nothing(
    specs, router, replicas, staleness, split, caching, policy, timing
):
    """Random arrivals (some sharing prefixes, some too long to ever fit), every built-in router, 1-4
    replicas or P/D pools, every staleness, sync or async; each replica audits its allocator every step."""
    t, requests = 0.0, []
    for i, (prompt, output, gap, family, extra) in enumerate(specs):
        t += gap
        tokens = list(range(family * 10_000, family * 10_000 + prompt)) + list(
            range(9_000_000 + 100 * i, 9_000_000 + 100 * i + extra)
        )
        requests.append(req(f"r{i}", 0, output, t, tokens=tokens))
    settings_ = {**SMALL, "enable_prefix_caching": caching, **timing}
    groups = (
        [ReplicaGroup(count=replicas, policy=policy, settings=settings_)]
        if split is None
        else [
            ReplicaGroup(count=split[0], role="prefill", policy=policy, settings=settings_),
            ReplicaGroup(count=split[1], role="decode", policy=policy, settings=settings_),
        ]
    )
    cluster = Cluster(FleetSpec(replicas=groups, router=router, staleness_s=staleness))
    cluster.run(requests)
    assert_cluster(cluster, requests)


def test_the_invariants_catch_a_lost_request():
    requests = [req("a", 30, 4, 0.0), req("b", 30, 4, 0.1)]
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(count=2)]))
    cluster.run(requests)
    cluster.records.rows.pop()
    assert [name for name, _ in check_cluster(cluster, requests)] == ["no-request-lost"]


def test_a_fleets_table_is_made_when_first_read_not_by_the_run(monkeypatch):
    """The run keeps rows; the table (pyarrow's first array from Python lists imports pandas, a third of a second) is
    the summary's work: none before the run ends, made once at the first read, every row in it."""
    from kvsched.metrics import records

    made = []
    monkeypatch.setattr(records, "arrow_table", lambda rows, schema: made.append(len(rows)) or ("table", len(rows)))
    requests = [req(f"r{i}", 30 + i, 4, 0.05 * i) for i in range(6)]
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(count=2)]))
    assert cluster.records.table is None
    cluster.run(requests)
    assert made == [] and len(cluster.records.rows) == 6
    assert cluster.records.table == ("table", 6) and cluster.records.table == ("table", 6) and made == [6]


def test_pd_takes_ttft_from_the_prefill_pool_and_charges_the_transfer():
    """A request's first token comes from its prefill replica; its KV reaches the decode replica after
    base latency + bytes / bandwidth; the decode replica computes no prefill for it."""
    requests = [req("a", 1000, 20, 0.0)]
    slow = KvTransfer(bandwidth_gb_per_s=0.5, base_latency_s=0.25)
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(role="prefill"), ReplicaGroup(role="decode")], transfer=slow))
    cluster.run(requests)
    assert_cluster(cluster, requests)
    row = next(cluster.records.named_rows())._asdict()
    prefill = cluster.replicas[0]
    moved = 0.25 + 1000 * prefill.engine.executor.profile.kv_bytes_per_token / 0.5e9
    assert row["output_tokens"] == 20 and row["status"] == "FINISHED_STOPPED"
    routes = cluster.records.routes
    assert [(route.pool, cluster.replicas[route.replica].name) for route in routes] == [
        ("prefill", "prefill-0"),
        ("decode", "decode-0"),
    ]
    assert routes[1].time == pytest.approx(row["first_token_time"] + moved)
    assert row["ttft"] == pytest.approx(row["first_token_time"])


@settings(max_examples=60)
@given(
    bandwidth=st.floats(1e-6, 1e300),
    latency=st.floats(0, 3600),
    tokens=st.integers(1, MAX_TOKENS),
    per_token=st.integers(0, MAX_KV_BYTES_PER_TOKEN),
)
def test_every_transfer_a_spec_allows_takes_a_finite_time(bandwidth, latency, tokens, per_token):
    """Before: a bandwidth of 1e-320 GB/s made each transfer infinite (no request reached the decode pool, exit 0)
    and a set-up of 1e308 s wrote Infinity into summary.json."""
    assert math.isfinite(KvTransfer(bandwidth_gb_per_s=bandwidth, base_latency_s=latency).seconds(tokens, per_token))


@pytest.mark.parametrize(
    "fields",
    [
        {"bandwidth_gb_per_s": 1e-320},
        {"bandwidth_gb_per_s": 0.0},
        {"bandwidth_gb_per_s": math.nan},
        {"base_latency_s": 1e308},
        {"base_latency_s": -1.0},
        {"base_latency_s": math.inf},
    ],
)
def test_a_transfer_that_would_never_end_is_refused(fields):
    with pytest.raises(ValidationError):
        KvTransfer(**fields)


def test_the_slowest_transfer_allowed_still_records_every_request_in_a_finite_summary():
    requests = [req(f"r{i}", 200, 5, 0.1 * i) for i in range(4)]
    slowest = KvTransfer(bandwidth_gb_per_s=1e-6, base_latency_s=3600)
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(role="prefill"), ReplicaGroup(role="decode")], transfer=slowest))
    cluster.run(requests)
    assert_cluster(cluster, requests)
    summary = fleet_summary(cluster)
    assert (
        summary["finished"] == 4
        and json.loads(json.dumps(summary, allow_nan=False, default=str))["e2e_s"]["mean"] > 3600
    )


@pytest.mark.parametrize(
    "requests",
    [
        [req("a", 30, 4, 0.0), req("a", 30, 4, 0.1)],  # round-robin: the second to the other replica
        [
            req("a", 30, 4, 0.0),
            req("b", 30, 4, 0.0),
            req("a", 30, 4, 50.0),
        ],  # the same replica, long after the first ended
    ],
    ids=["to another replica", "after it ended"],
)
@pytest.mark.parametrize("roles", [("mixed", "mixed"), ("prefill", "decode")])
def test_a_request_id_the_fleet_saw_before_is_refused(requests, roles):
    """Before: each replica knew only its own requests, took the second, and the id was recorded twice."""
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(role=role) for role in roles], router="round-robin"))
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        cluster.run(requests)


def test_a_decode_replica_computes_no_prefill_for_a_received_prompt():
    """The step that takes in a prompt handed over from the prefill pool costs what a step without
    its prompt costs (the KV is there); the same step on a co-located replica pays the prefill."""
    from kvsched.cluster.transfer import DecodeExecutor
    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.core.outputs import causal_pairs
    from kvsched.executors.simulated import SimulatedExecutor

    durations = {}
    for executor in (SimulatedExecutor("llama2-7b-a100"), DecodeExecutor("llama2-7b-a100")):
        engine = Engine(EngineConfig(num_gpu_blocks=200), "vllm-default", executor)
        engine.add_request(req("a", 1001, 5, 0.0))
        durations[type(executor).__name__] = engine.step().duration
    profile = SimulatedExecutor("llama2-7b-a100").profile
    # the 1,000 tokens before the last, and their query-key pairs (the last token's query still reads all 1,001)
    saved_ms = 1000 * profile.prefill_token_ms + profile.attention_pair_ms * causal_pairs(0, 1000)
    assert durations["SimulatedExecutor"] - durations["DecodeExecutor"] == pytest.approx(saved_ms / 1000)


def test_a_decode_replica_chunking_a_received_prompt_computes_none_of_it():
    """A received prompt longer than the decode replica's token budget runs in chunks: the chunks before
    the last load KV and compute nothing (a step that ran nothing), the last computes the first token
    only, about what the unchunked step costs; ``received`` counts the 1,000 prompt tokens it loaded."""
    from kvsched.cluster.transfer import DecodeExecutor
    from kvsched.core.config import EngineConfig
    from kvsched.core.engine import Engine
    from kvsched.executors.simulated import IDLE_SECONDS

    durations, received = {}, {}
    for budget in (256, 2048):
        executor = DecodeExecutor("llama2-7b-a100")
        config = EngineConfig(num_gpu_blocks=200, max_num_batched_tokens=budget, max_num_seqs=32, max_model_len=2048)
        engine = Engine(config, "vllm-v1", executor)
        engine.add_request(req("a", 1001, 1, 0.0))
        durations[budget] = [engine.step().duration for _ in range(4 if budget == 256 else 1)]
        assert not engine.has_unfinished()
        received[budget] = executor.received
    assert durations[256][:3] == [IDLE_SECONDS] * 3  # old: a token computed in each (base cost + one token)
    assert durations[256][3] == pytest.approx(durations[2048][0], rel=0.05)  # the last also reads its chunk's context
    assert received == {256: {0: 1000}, 2048: {0: 1000}}


def test_engine_run_pd_counts_what_a_single_engine_computes(tmp_path):
    """Same workload, no preemption, no prefix caching: each request's computed tokens in a 1 + 1 P/D fleet's
    requests.csv are the single engine's (its prompt on the prefill replica, its first token onward on the
    decode replica, not the KV it received), and nothing is recomputed or discarded."""
    import csv

    for name, fleet in (("single", []), ("pd", ["--prefill-replicas", "1", "--decode-replicas", "1"])):
        args = [ENGINE, "run", *fleet, "--workload", "synthetic", "-n", "30", "-q", "--output", str(tmp_path / name)]
        run = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
    single, pd = (list(csv.DictReader((tmp_path / name / "requests.csv").open())) for name in ("single", "pd"))
    assert [r["request_id"] for r in pd] == [r["request_id"] for r in single] and len(single) == 30
    assert {r["preemptions_recompute"] for r in single + pd} == {"0"}
    assert [r["computed_tokens"] for r in pd] == [r["computed_tokens"] for r in single]
    assert {(r["recomputed_tokens"], r["discarded_tokens"]) for r in pd} == {("0", "0")}


@pytest.mark.parametrize(
    "policy, caching, budget, prefill_blocks",
    [
        ("vllm-default", False, 4096, 4000),  # preempted on the decode replica, whole prompts
        ("vllm-v1", False, 64, 4000),  # chunked: some preempted before they had loaded all the transfer
        ("sarathi", True, 64, 40),  # preempted on both replicas, prefix hits on both
    ],
)
def test_pd_counts_what_the_fleet_recomputes(policy, caching, budget, prefill_blocks):
    """Replicas short of KV preempt by recompute: each request's counts are the fleet's. Its computed tokens
    are what a single engine computes without preemption (prompt + output - 1, less its prompt's prefix hits)
    plus what it recomputed; it recomputed no more than was thrown away, and without a prefix cache all of
    it (so a decode replica preempted before it had loaded the whole transfer discards the rest too)."""
    shared = tuple(range(1, 161))
    requests = [
        req(
            f"r{i}",
            0,
            5 + 11 * i % 90,
            0.02 * i,
            shared[: 16 * (i % 6)] + tuple(range(1000 * i, 1000 * i + 50 + 37 * i % 400)),
        )
        for i in range(1, 41)
    ]
    settings = {"enable_prefix_caching": caching, "max_num_batched_tokens": budget, "max_num_seqs": 32}
    spec = FleetSpec(
        replicas=[
            ReplicaGroup(role="prefill", policy=policy, settings={**settings, "num_gpu_blocks": prefill_blocks}),
            ReplicaGroup(role="decode", policy=policy, settings={**settings, "num_gpu_blocks": 40}),
        ]
    )
    cluster = Cluster(spec)
    cluster.run(requests)
    assert_cluster(cluster, requests)
    rows = [row._asdict() for row in cluster.records.named_rows()]
    assert sum(r["recomputed_tokens"] > 0 for r in rows) >= 5
    recompute = fleet_summary(cluster)["recompute"]
    for name in ("computed_tokens", "recomputed_tokens", "discarded_tokens"):
        assert recompute[name] == sum(r[name] for r in rows)
    for r in rows:
        first_time = r["prompt_tokens"] + r["output_tokens"] - 1 - r["cached_tokens"]
        assert r["computed_tokens"] == first_time + r["recomputed_tokens"], r
        assert (
            r["recomputed_tokens"] <= r["discarded_tokens"]
            if caching
            else r["recomputed_tokens"] == r["discarded_tokens"]
        )


def test_a_one_token_request_under_pd_ends_in_the_prefill_pool():
    requests = [req("a", 100, 1, 0.0), req("b", 100, 3, 0.0)]
    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(role="prefill"), ReplicaGroup(role="decode")]))
    cluster.run(requests)
    assert_cluster(cluster, requests)
    assert sorted(route.pool for route in cluster.records.routes) == ["decode", "prefill", "prefill"]


def test_a_heterogeneous_fleet_from_a_spec(tmp_path):
    spec = {
        "replicas": [
            {"count": 2, "policy": "vllm-default", "settings": {"num_gpu_blocks": 100}},
            {"count": 1, "policy": "sarathi", "profile": "llama2-7b-a100", "settings": {"num_gpu_blocks": 300}},
        ],
        "router": "least-outstanding",
        "staleness_s": 0.02,
    }
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(spec))
    cluster = Cluster(load_fleet(path))
    assert [(r.name, r.engine.policy_name, r.engine.config.num_gpu_blocks) for r in cluster.replicas] == [
        ("replica-0", "vllm-default", 100),
        ("replica-1", "vllm-default", 100),
        ("replica-2", "sarathi", 300),
    ]
    requests = [req(f"r{i}", 200, 30, 0.05 * i) for i in range(30)]
    cluster.run(requests)
    assert_cluster(cluster, requests)
    path.write_text(json.dumps({"replicas": [{"role": "prefill"}]}))
    with pytest.raises(FleetError, match="prefill and decode pools"):
        load_fleet(path)


def test_sessions_come_in_arrival_order_and_grow_their_prompts():
    spec = SessionSpec(num_sessions=30, rate=2.0, seed=3)
    requests = spec.requests()
    assert [r.arrival_time for r in requests] == sorted(r.arrival_time for r in requests)
    assert spec.num_requests == len(requests)
    turns: dict[str, list[Request]] = {}
    for r in requests:
        turns.setdefault(r.request_id.split("-")[0], []).append(r)
    for session in turns.values():
        for before, after in zip(session, session[1:]):
            assert after.prompt_token_ids[: before.prompt_len] == before.prompt_token_ids
            assert after.arrival_time >= before.arrival_time


def test_prefix_affinity_keeps_a_sessions_turns_together():
    """Multi-turn sessions on 4 replicas with prefix caching: prefix-affinity finds more of each prompt cached than
    round-robin, and more again when its load guard lets the fleet drift further from balance."""
    workload = SessionSpec(num_sessions=40, rate=2.0, think_time_s=2.0, seed=1).requests()
    rates = {}
    fleet = [ReplicaGroup(count=4, settings={"enable_prefix_caching": True})]
    unguarded = {"imbalanced_threshold": 64}
    for router, options in (("round-robin", {}), ("prefix-affinity", {}), ("prefix-affinity", unguarded)):
        cluster = Cluster(FleetSpec(replicas=fleet, router=router, router_options=options))
        cluster.run(workload)
        rates[router, options.get("imbalanced_threshold")] = fleet_summary(cluster)["prefix_hit_rate"]
    assert rates["prefix-affinity", None] > rates["round-robin", None] + 0.05
    assert rates["prefix-affinity", 64] > rates["prefix-affinity", None] + 0.05


# ------------------------------------------------------------------------- end to end
def _router(name: str) -> str:
    """The router's name if the installed metadata has it, else its module:Class (before a reinstall)."""
    from importlib.metadata import entry_points

    if list(entry_points(group="kvsched.routers", name=name)):
        return name
    from tests.test_routers import _declared

    return next(ep.value for ep in _declared() if ep.name == name)


def test_engine_run_replicas_end_to_end(tmp_path):
    out = tmp_path / "fleet"
    run = subprocess.run(
        [
            ENGINE,
            "run",
            "--replicas",
            "3",
            "--router",
            _router("vllm-dp"),
            "--staleness",
            "0.05",
            "--workload",
            "synthetic",
            "-n",
            "60",
            "--rate",
            "10",
            "-q",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=WIDE,
    )
    assert run.returncode == 0, run.stderr
    assert "3 replicas" in run.stdout and "replica-2" in run.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] == 60 and summary["fleet"]["replicas"] == 3 and summary["fleet"]["staleness_s"] == 0.05
    assert sum(r["routed"] for r in summary["replicas"]) == 60 and summary["leaked_blocks"] == 0
    lines = (out / "routes.csv").read_text().splitlines()
    assert len(lines) == 61 and "least waiting×4+running" in lines[1]
    explained = subprocess.run(
        [ENGINE, "explain", str(out), "--request", "req-5"], capture_output=True, text=True, timeout=120
    )
    assert explained.returncode == 0 and "mixed pool → replica-" in explained.stdout
    row = next(r for r in (out / "requests.csv").read_text().splitlines() if r.startswith("req-5,"))
    finished_on = summary["replicas"][int(row.split(",")[-3])]["replica"]
    assert (
        "ended FINISHED_" in explained.stdout
        and f" on {finished_on}:" in explained.stdout
        and "TTFT" in explained.stdout
    )


def test_engine_run_pd_end_to_end(tmp_path):
    run = subprocess.run(
        [
            ENGINE,
            "run",
            "--prefill-replicas",
            "1",
            "--decode-replicas",
            "2",
            "--workload",
            "synthetic",
            "-n",
            "30",
            "--transfer-gbps",
            "10",
            "-q",
            "--output",
            str(tmp_path / "pd"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "pd" / "summary.json").read_text())
    assert summary["fleet"]["disaggregated"] and summary["fleet"]["transfer"]["bandwidth_gb_per_s"] == 10
    assert [r["role"] for r in summary["replicas"]] == ["prefill", "decode", "decode"] and summary["finished"] == 30


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "2", "--router", "nope"], "unknown router 'nope'"),
        (["--prefill-replicas", "2"], "needs both --prefill-replicas and --decode-replicas"),
        (["--router", "round-robin"], "--router does not apply to one engine: it routes or shapes a fleet"),
        (["--replicas", "2", "--router-opt", "x=1"], "has no option 'x'"),
        (["--replicas", "0"], "--replicas"),
    ],
)
def test_bad_fleet_options_are_one_line_and_exit_2(args, message):
    run = subprocess.run([ENGINE, "run", "-n", "5", "-q", *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr and len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr


def test_engine_run_a_session_workload_on_a_fleet(tmp_path):
    """The documented example: multi-turn sessions from a JSON spec, prefix-affinity over prefix-caching replicas."""
    run = subprocess.run(
        [
            ENGINE,
            "run",
            "--replicas",
            "2",
            "--router",
            _router("prefix-affinity"),
            "--set",
            "enable_prefix_caching=true",
            "--workload",
            str(ROOT / "docs/examples/sessions.json"),
            "-n",
            "6",
            "-q",
            "--output",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=WIDE,
    )
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["workload"]["kind"] == "sessions" and summary["workload"]["num_sessions"] == 6
    assert summary["finished"] == summary["num_requests"] > 6 and summary["prefix_hit_rate"] > 0.3
