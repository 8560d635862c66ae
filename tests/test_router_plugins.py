"""Loading and calling a router trusts no plugin, as loading a policy does (tests/test_plugin_loading.py):
whatever its import, attributes, constructor, options or hooks raise or return (SystemExit included,
KeyboardInterrupt excepted) is one RouterError naming the router, its hook and its line, before any
result is written; a router name two distributions register is refused until one is chosen as
DIST:NAME, and ``engine routers`` lists both and what fails to load.

The routers come from throw-away distributions (``plugin_dists.make_dist``) and router files.
"""

from __future__ import annotations

import itertools
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from plugin_dists import engine, make_dist

from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
from kvsched.core.request import Request
from kvsched.plugins.discovery import AmbiguousPolicyError
from kvsched.routers import RouterError, UnknownRouterError, hookimpl
from kvsched.routers.plugins import RouterHooks, available_routers, load_router

_COUNT = itertools.count()

HEADER = """
from kvsched.routers import Route, hookimpl


class First:
    @hookimpl
    def route_request(self, request, replicas):
        return replicas[0]
"""


@pytest.fixture
def install(tmp_path, monkeypatch):
    """``install(source, routers)``: a distribution ``hostile-routers-N`` whose module (a fresh name each time)
    holds ``source``; its entry points under kvsched.routers map names to attributes of it."""

    def install(source: str, routers: dict[str, str], dist: str | None = None) -> str:
        n = next(_COUNT)
        module = f"hostile_routers_{n}"
        folder = make_dist(
            tmp_path / f"d{n}",
            dist or f"hostile-routers-{n}",
            {k: f"{module}:{v}" for k, v in routers.items()},
            {module: HEADER + source},
            group="kvsched.routers",
        )
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.delitem(sys.modules, module, raising=False)
        return module

    return install


def run_fleet(router, n: int = 6, **fields) -> Cluster:
    cluster = Cluster(
        FleetSpec(replicas=[ReplicaGroup(count=2, settings={"num_gpu_blocks": 256})], router=router, **fields)
    )
    cluster.run([Request(request_id=f"r{i}", prompt_len=40, output_len=4, arrival_time=0.01 * i) for i in range(n)])
    return cluster


def error_of(router, **fields) -> str:
    with pytest.raises(RouterError) as caught:
        run_fleet(router, **fields)
    text = str(caught.value)
    assert "\n" not in text and len(text) < 700, text
    return text


# -------------------------------------------------------------------------------- loading
@pytest.mark.parametrize(
    "raised, shown",
    [
        ("SystemExit(0)", "SystemExit: 0"),
        ("GeneratorExit('gone')", "GeneratorExit: gone"),
        ("RuntimeError('no GPU here')", "RuntimeError: no GPU here"),
    ],
)
def test_whatever_an_import_raises_names_the_router_and_its_distribution(install, raised, shown):
    module = install(f"raise {raised}\n", {"leaves": "First"})
    with pytest.raises(RouterError) as caught:
        RouterHooks("leaves")
    text = str(caught.value)
    assert (
        text.startswith(f"router 'leaves': its entry point {module}:First fails to load: {shown}")
        and "hostile-routers-" in text
    )


def test_keyboard_interrupt_on_import_is_not_swallowed(install):
    install("raise KeyboardInterrupt\n", {"stops": "First"})
    with pytest.raises(KeyboardInterrupt):
        load_router("stops")


def test_a_router_file_that_exits_on_import_is_named_by_its_path(tmp_path):
    draft = tmp_path / "draft_router.py"
    draft.write_text("raise SystemExit(3)\n")
    with pytest.raises(
        RouterError, match=rf"^router '{draft}:Mine': the file fails to load: SystemExit: 3 \(at .*draft_router.py:1\)"
    ):
        RouterHooks(f"{draft}:Mine")
    with pytest.raises(UnknownRouterError, match="router file '.*nowhere.py' does not exist"):
        RouterHooks(f"{tmp_path}/nowhere.py:Mine")


SOURCES = """
class Breaks(First):
    name = "breaks"

    def __init__(self):
        raise RuntimeError("constructor broke")


class Exits(First):
    name = "exits"

    def __init__(self):
        raise SystemExit(0)


class NumberName(First):
    name = 5


class EmptyName(First):
    name = ""


class Sly(str):
    def __len__(self):
        raise RuntimeError("no length")


class SlyName(First):
    name = Sly("sly")  # a str whose methods are plugin code


class RaisingName(First):
    @property
    def name(self):
        raise ValueError("no name today")


class RaisingDeclaration(First):
    name = "raising-declaration"

    @property
    def reads_reports_only(self):
        raise RuntimeError("undecided")


class RaisingDir(First):
    name = "raising-dir"

    def __dir__(self):
        raise RuntimeError("nothing to see")


class RaisingDoc(First):
    name = "raising-doc"

    @property
    def __doc__(self):
        raise RuntimeError("undocumented")


class WrongSignature:
    name = "wrong-signature"

    @hookimpl
    def route_request(self, request, replicas, budget):
        return replicas[0]


class Misspelt(First):
    name = "misspelt"

    @hookimpl
    def on_routd(self, request, replica):
        pass
"""


@pytest.mark.parametrize(
    "attr, message",
    [
        ("Breaks", "its constructor fails: RuntimeError: constructor broke (at "),
        ("Exits", "its constructor fails: SystemExit: 0 (at "),
        ("NumberName", "its name is 5, not a non-empty string"),
        ("EmptyName", "its name is '', not a non-empty string"),
        ("SlyName", "its name is 'sly', not a non-empty string"),
        ("RaisingName", "its name is <property object at "),  # read on the class, where it is a property
        ("RaisingDeclaration", "reading its 'reads_reports_only' fails: RuntimeError: undecided"),
        ("RaisingDir", "registering it fails: RuntimeError: nothing to see"),
        ("RaisingDoc", "reading its docstring fails: RuntimeError: undocumented"),
        ("WrongSignature", "invalid plugin: "),
        ("Misspelt", "invalid plugin: "),
    ],
)
def test_a_router_whose_code_fails_as_it_loads_is_one_error_naming_it(install, attr, message):
    """The constructor, the attributes the cluster reads (its name, its docstring, its declaration), pluggy's look."""
    install(SOURCES, {"the-router": attr})
    with pytest.raises(RouterError) as caught:
        RouterHooks("the-router")
    text = str(caught.value)
    assert text.startswith("router 'the-router': ") and message in text and "\n" not in text, (
        text
    )  # named as it was chosen


# ---------------------------------------------------------------------------- the hooks
class BadStr(Exception):
    def __str__(self):
        raise ValueError("not today")


def hostile(act, hook: str = "route_request"):
    """A round-robin router whose ``hook`` does ``act`` (a function of the hook's arguments) instead."""

    class Hostile:
        name = "hostile"

        def __init__(self):
            self.n = 0

        @hookimpl
        def route_request(self, request, replicas):
            self.n += 1
            if hook == "route_request":
                return act(replicas)
            return replicas[self.n % len(replicas)]

        @hookimpl
        def on_routed(self, request, replica):
            if hook == "on_routed":
                act(replica)

        @hookimpl
        def on_finished(self, request, replica):
            if hook == "on_finished":
                act(replica)

    return Hostile


def _raise(exc):
    raise exc


@pytest.mark.parametrize("hook", ["route_request", "on_routed", "on_finished"])
@pytest.mark.parametrize(
    "exc, shown",
    [
        (SystemExit(0), "raised SystemExit: 0"),
        (SystemExit(), "raised SystemExit"),
        (GeneratorExit("gone"), "raised GeneratorExit: gone"),
        (BadStr(), "raised BadStr: <BadStr whose str() raised>"),
        (ValueError("a\nb"), "raised ValueError: a b"),
    ],
)
def test_whatever_a_hook_raises_is_one_error_naming_the_router_the_hook_and_its_line(hook, exc, shown):
    text = error_of(hostile(lambda arg: _raise(exc), hook))
    assert text.startswith(f"router 'hostile' in {hook}: {shown} (at ") and "test_router_plugins.py:" in text, text


def test_keyboard_interrupt_in_a_hook_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        run_fleet(hostile(lambda replicas: _raise(KeyboardInterrupt())))


@pytest.mark.parametrize(
    "reason, problem",
    [
        ("a lone \udc80 surrogate", "valid UTF-8"),
        ("x" * 201, "at most 200 characters"),
        (b"bytes", "must be a str"),
        (type("Sly", (str,), {})("a str subclass"), "must be a str"),
        ("two\nlines", "one printable line"),
        ("\x1b[2Jclear", "one printable line"),
    ],
)
def test_a_reason_that_cannot_be_recorded_is_refused_when_given(reason, problem):
    """Before: a lone surrogate failed writing routes.csv after the whole run."""
    text = error_of(
        hostile(lambda replicas: __import__("kvsched.routers", fromlist=["Route"]).Route(replicas[0], reason))
    )
    assert text.startswith("router 'hostile' in route_request: gave the reason ") and problem in text, text


# ------------------------------------------------------------------ two distributions, one name
def test_a_router_name_two_distributions_register_is_refused_naming_both_until_one_is_chosen(install):
    module = install(
        "class Impostor(First):\n    '''Not the real round-robin.'''\n",
        {"round-robin": "Impostor"},
        dist="Impostor_Routers",
    )
    with pytest.raises(AmbiguousPolicyError) as caught:
        RouterHooks("round-robin")
    assert str(caught.value) == (
        f"router name 'round-robin' is registered by 2 distributions: Impostor_Routers 0.1 ({module}:Impostor), "
        "kvsched 0.1.0 (kvsched.routers.balance:RoundRobin); choose one with --router Impostor_Routers:round-robin "
        "or --router kvsched:round-robin"
    )
    with pytest.raises(AmbiguousPolicyError):
        Cluster(FleetSpec(replicas=[ReplicaGroup(count=2)]))  # the default router is no exception
    assert type(RouterHooks("kvsched:round-robin").router).__name__ == "RoundRobin"
    assert type(RouterHooks("impostor-routers:round-robin").router).__name__ == "Impostor"
    listed = available_routers()
    assert "round-robin" not in listed and {"kvsched:round-robin", "Impostor_Routers:round-robin"} <= set(listed)


# --------------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "router, options, message",
    [
        (
            "weighted",
            {"weights": "queue-depth:-1"},
            "the weight of queue-depth must be a finite number from 0, got -1.0",
        ),
        ("weighted", {"weights": "queue-depth:nan"}, "must be a finite number from 0, got nan"),
        ("weighted", {"weights": "queue-depth:1,queue-depth:2"}, "scorer queue-depth is weighted twice"),
        ("weighted", {"weights": "queue-depth:0"}, "weights names no scorer of a weight above 0"),
        ("weighted", {"weights": "cache:1"}, "unknown scorer 'cache'"),
        ("weighted", {"capacity": "0"}, "capacity must be an integer from 1 to 4,194,304, got 0"),
        ("prefix-affinity", {"block_size": "0"}, "block_size must be an integer from 1 to 2,147,483,648, got 0"),
        ("prefix-affinity", {"block_size": str(2**40)}, "block_size must be an integer from 1"),
        ("cache-aware", {"cache_threshold": "nan"}, "cache_threshold must be a finite number from 0 to 1, got nan"),
        (
            "cache-aware",
            {"balance_rel_threshold": "-1"},
            "balance_rel_threshold must be a finite number from 0, got -1.0",
        ),
        ("power-of-two", {"seed": str(2**70)}, "seed must be an integer from"),
        ("power-of-two", {"seed": "x"}, "option seed='x': Input should be a valid integer"),
        ("round-robin", {"x": "1"}, "has no option 'x'; its options: none"),
    ],
)
def test_router_options_are_bounded_as_policy_options_are(router, options, message):
    with pytest.raises(RouterError) as caught:
        RouterHooks(router, options)
    assert str(caught.value).startswith(f"router '{router}': ") and message in str(caught.value), str(caught.value)


def test_options_to_a_router_that_is_not_a_class_are_refused():
    with pytest.raises(RouterError, match="router 'First': options {'seed': 1} given, but the router is not a class"):
        RouterHooks(
            type("First", (), {"route_request": hookimpl(lambda self, request, replicas: replicas[0])})(), {"seed": 1}
        )


# -------------------------------------------------------------------- the console script
CLI_ROUTERS = """
class Impostor(First):
    '''Not the real round-robin.'''


class ExitsInHook(First):
    name = "exits-in-hook"

    @hookimpl
    def route_request(self, request, replicas):
        raise SystemExit(0)


class Surrogate(First):
    name = "surrogate"

    @hookimpl
    def route_request(self, request, replicas):
        return Route(replicas[0], "\\udc80")
"""

# name: (arguments, what the one error line on stderr must contain); {tmp}: a folder of the run's own
CLI_CASES = {
    "the default router is ambiguous": (
        ["run", "--replicas", "2", "-n", "5", "-q"],
        ["router name 'round-robin' is registered by 2 distributions", "--router kvsched:round-robin"],
    ),
    "SystemExit on import": (
        ["run", "--replicas", "2", "--router", "exits", "-n", "5", "-q"],
        ["router 'exits': its entry point cli_router_exits:First fails to load: SystemExit: 0", "cli-routers 0.1"],
    ),
    "SystemExit in a hook": (
        ["run", "--replicas", "2", "--router", "cli-routers:exits-in-hook", "-n", "5", "-q", "-o", "{tmp}/o1"],
        ["router 'cli-routers:exits-in-hook' in route_request: raised SystemExit: 0 (at "],
    ),
    "a lone surrogate reason": (
        ["run", "--replicas", "2", "--router", "cli-routers:surrogate", "-n", "5", "-q", "-o", "{tmp}/o2"],
        ["in route_request: gave the reason '\\udc80': "],
    ),
    "a negative weight": (
        [
            "run",
            "--replicas",
            "2",
            "--router",
            "kvsched:weighted",
            "--router-opt",
            "weights=queue-depth:-1",
            "-n",
            "5",
            "-q",
        ],
        ["router 'kvsched:weighted': bad options", "the weight of queue-depth must be a finite number from 0"],
    ),
    "an absurd block size": (
        [
            "run",
            "--replicas",
            "2",
            "--router",
            "kvsched:prefix-affinity",
            "--router-opt",
            "block_size=0",
            "-n",
            "5",
            "-q",
        ],
        ["block_size must be an integer from 1"],
    ),
    "a repeated option": (
        [
            "run",
            "--replicas",
            "2",
            "--router",
            "kvsched:power-of-two",
            "--router-opt",
            "seed=1",
            "--router-opt",
            "seed=2",
            "-n",
            "5",
            "-q",
        ],
        ["--router-opt seed is given twice ('1', then '2'): give it once"],
    ),
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    folder = make_dist(
        tmp_path_factory.mktemp("cli-routers"),
        "cli-routers",
        {
            "exits": "cli_router_exits:First",
            "round-robin": "cli_routers:Impostor",
            "exits-in-hook": "cli_routers:ExitsInHook",
            "surrogate": "cli_routers:Surrogate",
        },
        {"cli_router_exits": "raise SystemExit(0)\n", "cli_routers": HEADER + CLI_ROUTERS},
        group="kvsched.routers",
    )
    tmp = tmp_path_factory.mktemp("cli-runs")
    runs = {name: [a.format(tmp=tmp) for a in args] for name, (args, _) in CLI_CASES.items()}
    runs["routers"] = ["routers"]
    with ThreadPoolExecutor(3) as pool:
        return tmp, dict(zip(runs, pool.map(lambda args: engine(folder, *args), runs.values())))


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_the_console_script_says_what_broke_in_one_line_and_exits_2(cli, case):
    tmp, procs = cli
    proc, expected = procs[case], CLI_CASES[case][1]
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr, (
        proc.stderr
    )
    for text in expected:
        assert text in proc.stderr, proc.stderr
    assert not list(tmp.iterdir()), "a failed run wrote results"


def test_engine_routers_lists_both_distributions_and_shows_what_fails_to_load(cli):
    proc = cli[1]["routers"]
    assert proc.returncode == 0, proc.stderr
    rows = [
        line.split("│")[1:3] for line in proc.stdout.splitlines() if line.startswith("│") and line.split("│")[1].strip()
    ]
    rows = {name.strip(): dist.strip() for name, dist in rows}
    assert rows["kvsched:round-robin"] == "kvsched" and rows["cli-routers:round-robin"] == "cli-routers"
    assert "round-robin" not in rows and rows["weighted"] == "kvsched" and rows["exits"] == "cli-routers"
    assert (
        "(fails to load: router 'exits': its entry point cli_router_exits:First fails to load: SystemExit: 0"
        in proc.stdout
    )
    assert (
        "warning: round-robin is registered by cli-routers and kvsched: choose one with --router DIST:round-robin"
        in proc.stdout
    )
