"""Routing policies as plugins: loading and listing, the replica views a router reads (stale
reports, fresh in-flight counts, the real prefix cache), the validation of every choice, and each
built-in's rule."""

from __future__ import annotations

import copy
import pickle
import re
import subprocess
import sys
from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.core.request import Request, SamplingParams
from kvsched.plugins import discovery
from kvsched.routers import RouterError, UnknownRouterError, hookimpl, plugins
from kvsched.routers.balance import LeastOutstanding, PowerOfTwo, RoundRobin, VllmDp
from kvsched.routers.plugins import RouterHooks, available_routers, load_router
from kvsched.routers.prefix import CacheAware, PrefixAffinity
from kvsched.routers.prefix_index import PrefixIndex, prefix_hashes
from kvsched.routers.replica import InPrefill, RoutedReplica
from kvsched.routers.view import ReplicaView, Route, RoutingCall, Signals
from kvsched.routers.weighted import Weighted

ROOT = Path(__file__).resolve().parents[1]
BUILT_INS = (
    "round-robin",
    "least-outstanding",
    "power-of-two",
    "vllm-dp",
    "prefix-affinity",
    "precise-prefix",
    "cache-aware",
    "weighted",
)


def _declared() -> EntryPoints:
    """The routers pyproject.toml declares (what the installed metadata has after a reinstall)."""
    import tomllib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["kvsched.routers"]
    return EntryPoints(EntryPoint(name, value, plugins.ENTRY_POINT_GROUP) for name, value in table.items())


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """The built-in routers by name: from the installed metadata, or, in a checkout installed before
    they were declared, from pyproject.toml's declaration (the same entry points)."""
    if set(BUILT_INS) - set(available_routers()):
        declared, installed = _declared(), discovery.entry_points

        def entry_points(group, name=None):
            if group != plugins.ENTRY_POINT_GROUP:
                return installed(group=group) if name is None else installed(group=group, name=name)
            return EntryPoints(ep for ep in declared if name is None or ep.name == name)

        monkeypatch.setattr(discovery, "entry_points", entry_points)


def req(rid: str, tokens=None, prompt_len: int = 40, output_len: int = 8, arrival: float = 0.0) -> Request:
    prompt = {"prompt_token_ids": tuple(tokens)} if tokens is not None else {"prompt_len": prompt_len}
    return Request(
        request_id=rid,
        **prompt,
        output_len=output_len,
        arrival_time=arrival,
        sampling=SamplingParams(max_tokens=output_len),
    )


def fleet(n: int = 3, router="round-robin", caching: bool = False, **fields) -> Cluster:
    settings = {"num_gpu_blocks": 256, "enable_prefix_caching": caching, "block_size": 16}
    return Cluster(FleetSpec(replicas=[ReplicaGroup(count=n, settings=settings)], router=router, **fields))


# ------------------------------------------------------------------------------ plugins
def test_every_built_in_is_registered_loads_and_describes_itself():
    assert set(BUILT_INS) <= set(available_routers())
    for name in BUILT_INS:
        hooks = RouterHooks(name)
        assert hooks.name == name and hooks.description and not hooks.description.endswith(("(", ","))


def test_unknown_router_and_bad_options_are_named():
    with pytest.raises(UnknownRouterError, match="unknown router 'nope'; available: cache-aware"):
        load_router("nope")
    with pytest.raises(RouterError, match="router 'power-of-two'.*no option 'sed'.*seed"):
        RouterHooks("power-of-two", {"sed": "1"})
    with pytest.raises(RouterError, match="option seed='x'"):
        RouterHooks("power-of-two", {"seed": "x"})
    with pytest.raises(RouterError, match="router 'weighted'.*unknown scorer 'cache'"):
        RouterHooks("weighted", {"weights": "cache:1"})
    assert RouterHooks("power-of-two", {"seed": "7"}).router.rng.random() == PowerOfTwo(7).rng.random()


def test_a_router_without_route_request_is_refused():
    class Watcher:
        @hookimpl
        def on_finished(self, request, replica):
            pass

    with pytest.raises(RouterError, match="router 'Watcher'.*implements no route_request"):
        RouterHooks(Watcher)


# ------------------------------------------------------------------ validated choices
class Kept:
    """Returns a view kept from its first call."""

    def __init__(self):
        self.kept = None

    @hookimpl
    def route_request(self, request, replicas):
        if self.kept is None:
            self.kept = replicas[0]
        return self.kept


@pytest.mark.parametrize(
    "answer, message",
    [
        (lambda rs: None, "returned None for request 'r0'"),
        (lambda rs: 0, "returned 0, not one of the ReplicaViews"),
        (lambda rs: Route(rs[0], 5), "gave the reason 5: the reason must be a str"),
        (
            lambda rs: 1 / 0,
            r"in route_request: raised ZeroDivisionError: division by zero \(at .*test_routers.py:\d+\)",
        ),
    ],
)
def test_a_bad_choice_is_an_error_naming_the_router(answer, message):
    class Bad:
        name = "bad"

        @hookimpl
        def route_request(self, request, replicas):
            return answer(replicas)

    cluster = fleet(router=Bad)
    with pytest.raises(RouterError, match=rf"router 'bad'.*{message}"):
        cluster.run([req("r0")])


def test_a_view_kept_from_an_earlier_call_is_refused_and_cannot_be_read():
    router = Kept()
    with pytest.raises(RouterError, match="returned a view kept from an earlier call for request 'r1'"):
        fleet(router=router).run([req("r0"), req("r1", arrival=0.5)])
    with pytest.raises(RouterError, match="read a ReplicaView after its call returned"):
        _ = router.kept.num_waiting


def test_a_view_of_another_pool_is_refused():
    """Under P/D, a decode replica's view handed back in the prefill pool's call (a view it was not given)."""
    other = {}

    class Crossing:
        @hookimpl
        def route_request(self, request, replicas):
            if replicas[0].role == "decode" or "decode" not in other:
                other.setdefault(replicas[0].role, replicas[0])
                return replicas[0]
            return other["decode"]

    cluster = Cluster(FleetSpec(replicas=[ReplicaGroup(role="prefill"), ReplicaGroup(role="decode")], router=Crossing))
    with pytest.raises(RouterError, match="returned a view kept from an earlier call"):
        cluster.run([req("r0"), req("r1", arrival=5.0)])


def test_views_are_read_only():
    seen = []

    class Writer:
        @hookimpl
        def route_request(self, request, replicas):
            try:
                replicas[0].num_waiting = 3
            except AttributeError as exc:
                seen.append(str(exc))
            return replicas[0]

    fleet(router=Writer).run([req("r0")])
    assert seen and "num_waiting" in seen[0]


# ----------------------------------------------------------- nothing a router is handed can be written
# Each way a router might change the request it is handed: through ``__dict__``, ``object.__setattr__``, ``vars()``,
# plain assignment, or its sampling parameters.
REQUEST_WRITES = {
    "__dict__": lambda r: r.__dict__.__setitem__("output_len", 1),
    "object.__setattr__": lambda r: object.__setattr__(r, "prompt_len", 1),
    "vars": lambda r: vars(r).update(priority=-7, arrival_time=0.0),
    "setattr": lambda r: setattr(r, "output_len", 1),
    "sampling.__dict__": lambda r: r.sampling.__dict__.__setitem__("max_tokens", 1),
    "object.__setattr__ on sampling": lambda r: object.__setattr__(r.sampling, "max_tokens", 1),
}
# Each way a router might reach past a replica view: its slots, by name or through ``object.__setattr__``.
VIEW_WRITES = {
    "_call": lambda v: v._call.__setattr__("reports_only", False),
    "_state": lambda v: v._state.clear(),
    "set _call": lambda v: object.__setattr__(v, "_call", None),
    "set _state": lambda v: object.__setattr__(v, "_state", None),
    "_signals": lambda v: object.__setattr__(v, "_signals", Signals(0.0, 0, 0, 0, 0)),
    "__dict__": lambda v: v.__dict__.clear(),
}


class TriesEverything:
    """Round-robin, after trying every write above in every hook; counts what got through."""

    name = "tries-everything"

    def __init__(self):
        self.n, self.wrote = 0, []

    def attempt(self, request, views):
        for name, write in REQUEST_WRITES.items():
            try:
                write(request)
                self.wrote.append(name)
            except Exception:  # refused: what it should be
                pass
        for view in views:
            for name, write in VIEW_WRITES.items():
                try:
                    write(view)
                    self.wrote.append(f"view {name}")
                except Exception:
                    pass

    @hookimpl
    def route_request(self, request, replicas):
        self.attempt(request, replicas)
        self.n += 1
        return replicas[self.n % len(replicas)]

    @hookimpl
    def on_routed(self, request, replica):
        self.attempt(request, [replica])

    @hookimpl
    def on_finished(self, request, replica):
        self.attempt(request, [replica])


def test_no_router_hook_can_write_the_request_or_reach_past_a_view():
    """Before: ``request.__dict__["output_len"] = 1`` from a router hook changed the run (every output one token
    long)."""
    requests = [req(f"r{i}", prompt_len=30 + i, output_len=20, arrival=0.01 * i) for i in range(12)]
    honest = TriesEverything()
    honest.attempt = lambda request, views: None
    tried, plain = fleet(3, TriesEverything()), fleet(3, honest)
    tried.run(requests)
    plain.run(requests)
    assert tried.router.router.wrote == []
    assert tried.records.rows == plain.records.rows and tried.records.routes == plain.records.routes


class ReportsOnly:
    """Declares it reads only reports, then tries to read a fresh signal anyway, catching the refusal."""

    name = "reports-only"
    reads_reports_only = True

    def __init__(self, write):
        self.write = write

    @hookimpl
    def route_request(self, request, replicas):
        try:
            self.write(replicas[0])
        except (AttributeError, TypeError):
            pass
        try:
            _ = replicas[0].in_flight_requests
        except RouterError:
            pass
        return replicas[0]


@pytest.mark.parametrize("write", list(VIEW_WRITES))
def test_a_router_cannot_defeat_its_reads_reports_only_declaration(write):
    """Before: ``replicas[0]._call.reports_only = False`` let it read fresh signals while routed ahead of them. A
    refused read is the run's error even if the router catches it."""
    with pytest.raises(
        RouterError,
        match="router 'reports-only' in route_request: declares reads_reports_only but read in_flight_requests",
    ):
        fleet(2, ReportsOnly(VIEW_WRITES[write]), staleness_s=0.05).run([req("r0"), req("r1", arrival=0.01)])


class Stale:
    """vllm-dp's reading (the least waiting reported), after trying to see past its staleness."""

    name = "stale"

    def __init__(self, cheat: bool):
        self.cheat = cheat

    @hookimpl
    def route_request(self, request, replicas):
        if self.cheat:
            for view in replicas:
                try:
                    view._call.as_of = view._call.now
                except AttributeError:
                    pass
        best = min(replicas, key=lambda r: (r.num_waiting + r.num_running, r.index))
        return Route(best, f"{best.num_waiting} waiting")


def test_a_router_cannot_see_past_its_staleness():
    requests = [req(f"r{i}", prompt_len=300, output_len=40, arrival=0.01 * i) for i in range(30)]
    cheat, honest = fleet(3, Stale(True), staleness_s=1.0), fleet(3, Stale(False), staleness_s=1.0)
    cheat.run(requests)
    honest.run(requests)
    assert cheat.records.routes == honest.records.routes


def _forged(replicas):
    return ReplicaView.__new__(ReplicaView)


def _switched(view):
    """A view made by hand with ``view``'s hidden state, written through a class of the same ``__slots__``."""
    same = type("Same", (), {"__slots__": ReplicaView.__slots__})
    view.__class__ = same
    made = object.__new__(same)
    for slot in ReplicaView.__slots__:
        setattr(made, slot, getattr(view, slot))
    view.__class__ = made.__class__ = ReplicaView
    return made


@pytest.mark.parametrize(
    "make, message",
    [
        (_forged, "returned a ReplicaView the cluster did not make (a copy, or one made by hand)"),
        (lambda rs: copy.copy(rs[0]), "returned a ReplicaView the cluster did not make"),
        (lambda rs: copy.deepcopy(rs[0]), "returned a ReplicaView the cluster did not make"),
        (lambda rs: pickle.loads(pickle.dumps(rs[0])), "returned a ReplicaView the cluster did not make"),
        (lambda rs: _switched(rs[0]), "returned a ReplicaView the cluster did not make"),
        (
            lambda rs: (rs[0], "a plain tuple"),
            "returned (<ReplicaView replica-0>, 'a plain tuple'), not one of the ReplicaViews",
        ),
    ],
)
def test_a_forged_copied_or_made_view_is_refused_as_the_routers_error(make, message):
    """Before: each of these ended in ``unexpected AttributeError`` (exit 1), naming no router."""

    class Forger:
        name = "forger"

        @hookimpl
        def route_request(self, request, replicas):
            return make(replicas)

    with pytest.raises(RouterError, match=re.escape(f"router 'forger' in route_request: {message}")):
        fleet(router=Forger).run([req("r0")])


def test_reading_a_forged_or_copied_view_is_the_routers_error_at_its_line():
    class Reader:
        name = "reader"

        @hookimpl
        def route_request(self, request, replicas):
            _ = copy.copy(replicas[0]).num_waiting
            return replicas[0]

    with pytest.raises(
        RouterError, match=r"router 'reader' in route_request: raised AttributeError: .* \(at .*test_routers.py:\d+\)"
    ):
        fleet(router=Reader).run([req("r0")])


# -------------------------------------------------------------------------- the views
def test_a_stale_view_shows_the_newest_report_at_least_staleness_old():
    cluster = fleet(1, staleness_s=0.05)
    replica = cluster.replicas[0]
    replica._reports.extend([Signals(0.01, 3, 1, 0, 200), Signals(0.04, 5, 2, 0, 190), Signals(0.07, 1, 6, 0, 150)])
    assert replica.signals_as_of(0.045 - 0.05).num_waiting == 0  # nothing reported that long ago: the first report
    assert replica.signals_as_of(0.095 - 0.05).num_waiting == 5
    assert replica.signals_as_of(0.13 - 0.05).num_running == 6


def test_views_read_a_replica_only_through_the_declared_protocol():
    """``routers/replica.py``'s ``RoutedReplica`` is all a view reads: a stand-in with its members and nothing
    else (no engine) shows every field, and the fleet's own replica is one."""

    class StandIn:
        name, role, profile_name, policy_name, block_size, num_gpu_blocks = "s0", "mixed", "p", "fcfs", 16, 100
        in_flight_requests, in_flight_tokens = 2, 300

        def signals_as_of(self, t):
            return Signals(t, 4, 3, 1, 25)

        def in_prefill(self):
            return InPrefill(1, 120)

        def cached_prefix_blocks(self, hashes):
            return len(hashes) - 1

    assert isinstance(StandIn(), RoutedReplica) and isinstance(fleet(1).replicas[0], RoutedReplica)
    call = RoutingCall(1.0, 0.25, "reader", replicas=[StandIn()])
    _, (view,) = call.begin()
    try:
        shown = (
            view.name,
            view.role,
            view.profile,
            view.policy,
            view.block_size,
            view.num_gpu_blocks,
            view.report,
            view.in_flight_requests,
            view.in_flight_tokens,
            view.in_prefill_requests,
            view.in_prefill_tokens,
            view.kv_usage,
            view.cached_prefix_tokens(req("a", tokens=list(range(40)))),
        )
    finally:
        call.end()
    assert shown == ("s0", "mixed", "p", "fcfs", 16, 100, Signals(0.75, 4, 3, 1, 25), 2, 300, 1, 120, 0.75, 16)


def test_staleness_changes_what_a_router_sees():
    """The same arrivals under vllm-dp: with no staleness the reports of finished steps steer it; with
    a second of staleness it sees only the empty first reports and its own sends."""
    requests = [req(f"r{i}", prompt_len=300, output_len=40, arrival=0.01 * i) for i in range(40)]
    fresh, stale = fleet(4, "vllm-dp"), fleet(4, "vllm-dp", staleness_s=1.0)
    fresh.run(requests)
    stale.run(requests)
    seen_fresh = [route.reason for route in fresh.records.routes]
    seen_stale = [route.reason for route in stale.records.routes]
    assert seen_fresh != seen_stale
    assert all(
        r.endswith((": 0", ": 4", ": 8", ": 12", ": 16", ": 20", ": 24", ": 28", ": 32", ": 36")) for r in seen_stale
    )


def test_prefix_hashes_name_the_blocks_the_engine_caches():
    """One list of hashes asks the router's table and a replica's real cache: after a prompt ran, a
    request sharing 3 of its blocks finds exactly the tokens the engine itself finds cached."""
    cluster = fleet(1, caching=True)
    shared = list(range(1000, 1048))
    cluster.run([req("a", tokens=shared + list(range(5000, 5030)))])
    replica = cluster.replicas[0]
    probe = req("b", tokens=shared + list(range(7000, 7020)))
    blocks = replica.cached_prefix_blocks(prefix_hashes(probe.prompt_token_ids, 16))
    replica.engine.add_request(probe)
    view = replica.engine.waiting[0]
    assert blocks == 3 and replica.engine.cache.num_cached_tokens(view) == 3 * 16
    hashes = prefix_hashes(probe.prompt_token_ids, 16)  # the engine's CacheView answers it: leading blocks only
    assert replica.engine.cache.cached_prefix_blocks([hashes[0], -1, hashes[2]]) == 1


def test_in_flight_counts_are_the_routers_own_and_fresh():
    seen = []

    class Recorder:
        @hookimpl
        def route_request(self, request, replicas):
            seen.append([(r.in_flight_requests, r.in_flight_tokens) for r in replicas])
            return replicas[0]

    fleet(2, Recorder).run([req("a", prompt_len=40), req("b", prompt_len=60, arrival=0.0), req("c", arrival=100.0)])
    assert seen == [[(0, 0), (0, 0)], [(1, 40), (0, 0)], [(0, 0), (0, 0)]]


# -------------------------------------------------------------------- the rules (unit)
def views(*loads, **fields):
    """Duck-typed replica views: each load a dict of view attributes."""
    base = {
        "reported_at": 0.0,
        "num_waiting": 0,
        "num_running": 0,
        "in_flight_requests": 0,
        "in_flight_tokens": 0,
        "in_prefill_requests": 0,
        "in_prefill_tokens": 0,
        "kv_usage": 0.0,
    }
    out = []
    for i, load in enumerate(loads):
        cached = load.pop("cached", 0)
        f = {**base, **load}
        report = Signals(f["reported_at"], f["num_waiting"], f["num_running"], 0, 0)
        out.append(
            SimpleNamespace(
                name=f"replica-{i}", index=i, **f, report=report, cached_prefix_tokens=lambda request, c=cached: c
            )
        )
    return tuple(out)


def chosen(answer):
    return answer.replica if isinstance(answer, Route) else answer


def test_round_robin_and_least_outstanding():
    rr = RoundRobin()
    replicas = views({}, {}, {})
    assert [chosen(rr.route_request(None, replicas)).name for _ in range(4)] == [
        "replica-0",
        "replica-1",
        "replica-2",
        "replica-0",
    ]
    loads = views({"in_flight_requests": 3}, {"in_flight_requests": 1}, {"in_flight_requests": 1})
    router = LeastOutstanding(seed=3)
    picks = [chosen(router.route_request(None, loads)).index for _ in range(40)]
    assert set(picks) == {1, 2}  # the tie goes either way, never to the busier replica
    again = LeastOutstanding(seed=3)
    assert [chosen(again.route_request(None, loads)).index for _ in range(40)] == picks  # seeded


def test_power_of_two_takes_the_less_loaded_of_two_draws():
    replicas = views(*({"in_flight_requests": n} for n in (5, 0, 9, 7)))
    router = PowerOfTwo(seed=1)
    picks = [chosen(router.route_request(None, replicas)).index for _ in range(200)]
    assert 2 not in picks  # the busiest is never the lighter of two
    assert picks.count(1) > 90  # the idlest wins every draw it is in (3 of 6 pairs)


def test_vllm_dp_scores_waiting_four_times_and_counts_its_own_sends_until_a_new_report():
    router = VllmDp()
    replicas = views(
        {"num_waiting": 1, "num_running": 0}, {"num_waiting": 0, "num_running": 3}, {"num_waiting": 0, "num_running": 5}
    )
    picks = [chosen(router.route_request(None, replicas)).index for _ in range(3)]
    assert picks == [1, 0, 2]  # scores 4, 3, 5; then replica 1 counts one sent as waiting (7); then replica 0 (8)
    fresh = views(
        {"num_waiting": 1, "num_running": 0, "reported_at": 1.0},
        {"num_waiting": 0, "num_running": 3, "reported_at": 1.0},
        {"num_waiting": 0, "num_running": 5, "reported_at": 1.0},
    )
    assert chosen(router.route_request(None, fresh)).index == 1  # a new report: the sends are in it


def test_prefix_affinity_follows_the_longest_prefix_it_sent():
    router = PrefixAffinity(block_size=4, seed=0)
    replicas = views({}, {}, {})
    a = req("a", tokens=range(16))
    first = chosen(router.route_request(a, replicas))
    router.on_routed(a, first)
    again = req("b", tokens=list(range(12)) + [99, 98, 97, 96])
    assert all(chosen(router.route_request(again, replicas)).index == first.index for _ in range(5))


def test_prefix_index_keeps_the_most_recent_blocks_per_replica():
    index = PrefixIndex(capacity=4)
    index.insert("x", [1, 2, 3])
    index.insert("y", [1, 2])
    assert index.matches([1, 2, 3, 4]) == {"x": 3, "y": 2}
    index.insert("x", [7, 8])  # x keeps 4: its oldest (1) goes
    assert index.matches([1, 2]) == {"y": 2} and index.size("x") == 4


def test_cache_aware_falls_back_to_the_least_loaded_when_imbalanced():
    router = CacheAware(block_size=4)
    a = req("a", tokens=range(16))
    replicas = views({"in_flight_requests": 10}, {"in_flight_requests": 10})
    router.on_routed(a, replicas[0])
    assert chosen(router.route_request(a, replicas)).index == 0  # balanced: the prefix
    busy = views({"in_flight_requests": 100}, {"in_flight_requests": 10})
    answer = router.route_request(a, busy)
    assert chosen(answer).index == 1 and "imbalanced" in answer.reason
    fresh = req("c", tokens=range(500, 516))
    assert chosen(router.route_request(fresh, replicas)).index == 1  # a miss: the smaller table


def test_weighted_sums_llm_d_scorers():
    router = Weighted()
    replicas = views(
        {"cached": 64, "num_waiting": 4, "kv_usage": 0.9},
        {"cached": 0, "num_waiting": 0, "kv_usage": 0.1},
        {"cached": 32, "num_waiting": 0, "kv_usage": 0.5},
    )
    prompt = req("p", prompt_len=64)  # the prefix scores are the share of its 64 tokens cached: 1, 0, 0.5
    # totals: 2×1 + 0 + 0.1 = 2.1; 0 + 1 + 0.9 = 1.9; 2×0.5 + 1 + 0.5 = 2.5
    answer = router.route_request(prompt, replicas)
    assert chosen(answer).index == 2 and answer.reason.startswith("score 2.50")
    load_only = Weighted(weights="queue-depth:1,kv-utilization:1")
    assert chosen(load_only.route_request(prompt, replicas)).index == 1


# ------------------------------------------------------------------------- the command
def test_engine_routers_lists_the_built_ins():
    from importlib.metadata import entry_points

    if not list(entry_points(group="kvsched.routers")):
        pytest.skip("the installed metadata predates kvsched.routers: reinstall (make setup) to list them")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "engine"), "routers"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for name in BUILT_INS:
        assert name in out.stdout
