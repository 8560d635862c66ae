"""Loading a policy trusts no plugin: whatever its import, attributes, constructor or hook markers
raise (SystemExit and GeneratorExit included, KeyboardInterrupt excepted) is one PolicyError that
names the policy and where it comes from; a name two distributions register is refused until one
is chosen as DIST:NAME; a bad hook signature is blamed on the class that defines it.

The policies come from throw-away distributions (``plugin_dists.make_dist``: a module and a
``.dist-info`` folder), found through ``importlib.metadata`` entry points like any installed one.
"""

from __future__ import annotations

import itertools
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from plugin_dists import engine, make_dist

from kvsched import Engine, EngineConfig, SimulatedExecutor, hookimpl
from kvsched.core.plugins import PolicyHooks
from kvsched.errors import PolicyError, UnknownPolicyError
from kvsched.executors.profiles import resolve_profile
from kvsched.executors.settings import fit_to_profile
from kvsched.plugins.discovery import AmbiguousPolicyError, available_policies, load_policy
from kvsched.policies.vllm_default import VllmDefault
from kvsched.testing.resolve import resolve_policy

_COUNT = itertools.count()

HEADER = """
from kvsched import hookimpl
from kvsched.policies.vllm_default import VllmDefault
"""


@pytest.fixture
def install(tmp_path, monkeypatch):
    """``install(source, entry_points)``: a distribution ``hostile-N`` whose module (a fresh name each
    time) holds ``source``; entry points map names to attributes of it. Returns the module name."""

    def install(source: str, policies: dict[str, str], dist: str | None = None) -> str:
        n = next(_COUNT)
        module = f"hostile_loading_{n}"
        folder = make_dist(
            tmp_path / f"d{n}",
            dist or f"hostile-{n}",
            {k: f"{module}:{v}" for k, v in policies.items()},
            {module: HEADER + source},
        )
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.delitem(sys.modules, module, raising=False)
        return module

    return install


def load_error(spec: str) -> str:
    with pytest.raises(PolicyError) as caught:
        Engine(EngineConfig(), spec, SimulatedExecutor())
    return str(caught.value)


@pytest.mark.parametrize(
    "raised, shown",
    [
        ("SystemExit(0)", "SystemExit: 0"),
        ("SystemExit()", "SystemExit"),
        ("GeneratorExit('gone')", "GeneratorExit: gone"),
        ("type('Odd', (BaseException,), {})('odd')", "Odd: odd"),
        ("RuntimeError('no GPU here')", "RuntimeError: no GPU here"),
    ],
)
def test_whatever_an_import_raises_names_the_entry_point_and_its_distribution(install, raised, shown):
    install(f"raise {raised}\n", {"leaves": "Policy"}, dist="leaving-dist")
    text = load_error("leaves")
    assert text.startswith("policy 'leaves': its entry point hostile_loading_") and "fails to load: " + shown in text
    assert "(from distribution leaving-dist 0.1)" in text and "\n" not in text


def test_keyboard_interrupt_on_import_is_not_swallowed(install):
    install("raise KeyboardInterrupt\n", {"interrupted": "Policy"})
    with pytest.raises(KeyboardInterrupt):
        load_policy("interrupted")


def test_a_plugin_raising_keyboard_interrupt_at_import_is_one_row_of_the_listing(tmp_path):
    """engine policies once ended with exit 130 and listed nothing: only a real Ctrl-C ends the listing."""
    folder = make_dist(
        tmp_path / "dists",
        "interrupting-dist",
        {"interrupting": "interrupting_mod:Policy"},
        {"interrupting_mod": "raise KeyboardInterrupt('not mine to end')\n"},
    )
    listed = engine(folder, "policies")
    assert listed.returncode == 0, listed.stderr
    rows = [line for line in listed.stdout.splitlines() if "interrupting-dist" in line]
    assert len(rows) == 1 and "(fails to load: KeyboardInterrupt: not mine" in rows[0], listed.stdout
    assert "interrupting_mod.py:1" in "".join(listed.stdout.split())
    assert "│ vllm-v1 " in listed.stdout and "│ fcfs " in listed.stdout


def test_ctrl_c_while_the_policies_are_listed_still_ends_the_listing():
    import os
    import signal
    from types import SimpleNamespace

    from kvsched.cli.common import print_plugins

    def pressed(spec):
        os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, as the terminal sends it
        return "never described"

    listed = SimpleNamespace(spec="ctrl-c", name="ctrl-c", distribution="dist", version="0.1", ambiguous=False)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        print_plugins("policy", [listed], pressed)
    assert signal.getsignal(signal.SIGINT) is before  # the handler the listing found, back


def test_a_policy_file_or_module_that_exits_on_import_is_named_by_its_path(install, tmp_path):
    draft = tmp_path / "exits_draft.py"
    draft.write_text("raise SystemExit(3)\n")
    with pytest.raises(
        PolicyError, match=rf"policy '{draft}:Policy': the file fails to load: SystemExit: 3 \(at .*exits_draft.py:1\)"
    ):
        load_policy(f"{draft}:Policy")
    module = install("raise SystemExit('bye')\n", {})
    with pytest.raises(PolicyError, match=rf"policy '{module}:Policy': the module fails to load: SystemExit: bye"):
        load_policy(f"{module}:Policy")


def test_a_draft_subclass_in_a_file_is_named_by_its_class_not_the_name_it_inherits(tmp_path):
    draft = tmp_path / "draft_exits.py"
    draft.write_text(HEADER + "class Draft(VllmDefault):\n    def __init__(self):\n        raise SystemExit(5)\n")
    text = load_error(f"{draft}:Draft")
    assert text == f"policy 'Draft': its constructor fails: SystemExit: 5 (at {draft}:6) (from file {draft})"


CONSTRUCTORS = """
class Exits(VllmDefault):
    def __init__(self):
        raise SystemExit(1)


class Breaks(VllmDefault):
    def __init__(self):
        raise OSError("no such device")


class Meta(type):
    def __call__(cls, *args, **kwargs):
        raise LookupError("not today")


class MetaCall(VllmDefault, metaclass=Meta):
    pass
"""


@pytest.mark.parametrize(
    "name, shown",
    [("exits", "SystemExit: 1"), ("breaks", "OSError: no such device"), ("meta-call", "LookupError: not today")],
)
def test_a_constructor_that_raises_anything_names_the_policy_and_its_line(install, name, shown):
    install(CONSTRUCTORS, {"exits": "Exits", "breaks": "Breaks", "meta-call": "MetaCall"}, dist="ctor-dist")
    text = load_error(name)
    assert text.startswith(f"policy '{name}': its constructor fails: {shown} (at ")
    assert text.endswith("(from distribution ctor-dist 0.1)")


ATTRIBUTES = """
class NumberName(VllmDefault):
    name = 42


class NumberDefaults(VllmDefault):
    engine_defaults = 7


class ListDefaults(VllmDefault):
    engine_defaults = ["watermark"]


class NumberKeys(VllmDefault):
    engine_defaults = {1: 2}


class RaisingDefaults(VllmDefault):
    @property
    def engine_defaults(self):
        raise SystemExit("defaults")


class Meta(type):
    def __getattr__(cls, attr):
        raise OSError(f"no {attr}")


class MetaGetattr(VllmDefault, metaclass=Meta):
    pass


class InstanceGetattr(VllmDefault):
    def __getattr__(self, attr):
        raise RuntimeError(f"no {attr}")


class RaisingDir(VllmDefault):
    def __dir__(self):  # pluggy lists a plugin's attributes to find its hooks
        raise SystemExit("no listing")


class SignatureMeta(type):
    @property
    def __signature__(cls):  # what inspect.signature asks first
        raise SystemExit("no signature")


class RaisingSignature(VllmDefault, metaclass=SignatureMeta):
    pass


def __getattr__(attr):
    raise SystemExit(f"module has no {attr}")
"""


@pytest.mark.parametrize(
    "name, message",
    [
        ("number-name", "its name is 42, not a non-empty string"),
        ("number-defaults", "its engine_defaults is 7, not a dict of engine settings"),
        ("list-defaults", "its engine_defaults is ['watermark'], not a dict of engine settings"),
        ("number-keys", "its engine_defaults has 1 as a setting name, not a string"),
        ("raising-defaults", "reading its 'engine_defaults' fails: SystemExit: defaults (at "),
        ("instance-getattr", "reading its 'engine_defaults' fails: RuntimeError: no engine_defaults (at "),
        ("raising-dir", "registering it fails: SystemExit: no listing (at "),
        ("module-getattr", "its entry point hostile_loading_"),
    ],
)
def test_an_attribute_read_that_fails_or_has_the_wrong_type_names_the_policy(install, name, message):
    install(
        ATTRIBUTES,
        {
            "number-name": "NumberName",
            "number-defaults": "NumberDefaults",
            "list-defaults": "ListDefaults",
            "number-keys": "NumberKeys",
            "raising-defaults": "RaisingDefaults",
            "meta-getattr": "MetaGetattr",
            "instance-getattr": "InstanceGetattr",
            "raising-dir": "RaisingDir",
            "module-getattr": "NoSuchAttribute",
        },
        dist="attr-dist",
    )
    text = load_error(name)
    assert text.startswith(f"policy '{name}': {message}") and text.endswith("(from distribution attr-dist 0.1)"), text


@pytest.mark.parametrize(
    "name, message",
    [
        ("number-defaults", "its engine_defaults is 7, not a dict"),
        ("meta-getattr", "reading its 'engine_defaults' fails: OSError: no engine_defaults"),
    ],
)
def test_engine_defaults_that_fail_name_the_policy_when_a_job_fits_its_profile(install, name, message):
    """SimJob reads them from the class before any engine exists (``fit_to_profile``)."""
    install(ATTRIBUTES, {"number-defaults": "NumberDefaults", "meta-getattr": "MetaGetattr"}, dist="attr-dist")
    with pytest.raises(PolicyError, match=rf"policy '{name}': {message}.*\(from distribution attr-dist 0.1\)$"):
        fit_to_profile(EngineConfig(), resolve_profile("llama2-7b-a100"), load_policy(name))


def test_policy_options_checked_against_a_constructor_whose_signature_raises_name_the_policy(install):
    from kvsched.cli.common import policy_options

    install(ATTRIBUTES, {"raising-signature": "RaisingSignature"}, dist="attr-dist")
    with pytest.raises(
        PolicyError,
        match=r"^policy 'raising-signature': reading its constructor's signature fails: "
        r"SystemExit: no signature \(at .*\(from distribution attr-dist 0.1\)$",
    ):
        policy_options("raising-signature", ["budget=1"])


def test_options_a_constructor_passes_on_to_its_base_are_converted_once_by_the_base_annotations():
    from kvsched.cli.common import policy_options
    from kvsched.policies.ewsjf import Ewsjf
    from kvsched.policies.hrrn import Hrrn

    # ewsjf takes **v1 and passes it to VllmV1; hrrn passes it through WindowedV1 to VllmV1
    hooks = PolicyHooks("ewsjf", {"long_prefill_token_threshold": "8", "cache_aware_admission_threshold": "1"})
    assert (hooks.policy.long_prefill_token_threshold, hooks.policy.cache_aware_threshold) == (8, 1.0)
    assert type(hooks.policy.cache_aware_threshold) is float
    assert PolicyHooks("hrrn", {"window": "4", "prefill_tokens_per_s": "5"}).policy.tokens_per_s == 5.0
    with pytest.raises(ValueError, match=r"^--policy-opt long_prefill_token_threshold=x: .*valid integer.* is int\)$"):
        policy_options("ewsjf", ["long_prefill_token_threshold=x"])
    # built in Python, the constructors still check the ranges the loader does not
    with pytest.raises(ValueError, match="long_prefill_token_threshold must be >= 0"):
        Ewsjf(long_prefill_token_threshold=-1)
    with pytest.raises(ValueError, match="prefill_tokens_per_s must be > 0"):
        Hrrn(prefill_tokens_per_s=0)
    with pytest.raises(PolicyError, match=r"bad options .*window must be >= 1, got 0"):
        PolicyHooks("hrrn", {"window": "0"})


class _BaseWithAnUnresolvableHint:
    def __init__(self, depth: NoSuchType = 1) -> None:  # noqa: F821  (never resolves)
        self.depth = depth


class PassesOnToAnUnresolvableBase(_BaseWithAnUnresolvableHint):
    def __init__(self, rate: float = 1.0, **rest) -> None:
        super().__init__(**rest)
        self.rate = rate


def test_a_base_whose_hints_do_not_resolve_leaves_the_constructors_own_hints():
    """The base's annotation is its own to check; the plugin's own ``rate: float`` is still converted (before, one
    unresolvable hint up the chain dropped every hint, and ``rate`` arrived as the string ``"0.5"``)."""
    from kvsched.plugins.options import constructor_signature

    assert constructor_signature(PassesOnToAnUnresolvableBase, "passes-on")[1]["rate"] is float


class WrongSignature(VllmDefault):
    """Inherits vllm-default's name; its own select_batch takes an argument no hook passes."""

    @hookimpl
    def select_batch(self, step, budget):
        return None


class Misspelt(VllmDefault):
    @hookimpl
    def select_btach(self, step):
        return None


def test_a_wrong_hook_signature_is_blamed_on_the_class_that_defines_it_not_the_inherited_name():
    with pytest.raises(PolicyError) as caught:
        PolicyHooks(WrongSignature)
    text = str(caught.value)
    line = WrongSignature.select_batch.__code__.co_firstlineno
    assert text.startswith(
        "policy 'WrongSignature': invalid plugin: WrongSignature.select_batch(step, budget) "
        f"(at tests/test_plugin_loading.py:{line}): Argument(s) {{'budget'}} are declared"
    )
    assert "vllm-default" not in text and "\n" not in text
    with pytest.raises(
        PolicyError,
        match=r"policy 'Misspelt': invalid plugin: Misspelt.select_btach\(step\) .*"
        r"kvsched has no hook 'select_btach' \(hooks: select_batch, ",
    ):
        PolicyHooks(Misspelt)


def test_a_wrong_hook_signature_of_an_installed_policy_is_named_by_its_entry_point(install):
    install(
        "class Child(VllmDefault):\n    @hookimpl\n    def choose_preemption(self, step, victim):\n        return "
        "None\n",
        {"child": "Child"},
        dist="child-dist",
    )
    assert load_error("child").startswith("policy 'child': invalid plugin: Child.choose_preemption(step, victim) (at ")


IMPOSTOR = '''
class Impostor(VllmDefault):
    """Not the real vllm-default."""
'''


def test_a_name_two_distributions_register_is_refused_naming_both_until_one_is_chosen(install):
    module = install(IMPOSTOR, {"vllm-default": "Impostor"}, dist="Impostor_Dist")
    with pytest.raises(AmbiguousPolicyError) as caught:
        load_policy("vllm-default")
    assert str(caught.value) == (
        f"policy name 'vllm-default' is registered by 2 distributions: Impostor_Dist 0.1 ({module}:Impostor), "
        "kvsched 0.1.0 (kvsched.policies.vllm_default:VllmDefault); "
        "choose one with --policy Impostor_Dist:vllm-default or --policy kvsched:vllm-default"
    )
    assert load_policy("kvsched:vllm-default") is VllmDefault
    assert load_policy("impostor-dist:vllm-default").__name__ == "Impostor"  # as pip compares names
    assert Engine(EngineConfig(), "kvsched:vllm-default", SimulatedExecutor()).hooks.name == "kvsched:vllm-default"
    specs = available_policies()
    assert "vllm-default" not in specs and specs["kvsched:vllm-default"].distribution == "kvsched"
    assert specs["Impostor_Dist:vllm-default"].target.endswith(":Impostor")
    assert resolve_policy("kvsched:vllm-default") == ("kvsched:vllm-default", VllmDefault)  # engine check, compare
    assert resolve_policy("kvsched.policies.vllm_default:VllmDefault") == (
        "vllm-default",
        VllmDefault,
    )  # module:Attr as before
    with pytest.raises(
        UnknownPolicyError,
        match=r"^distribution 'impostor-dist' registers no policy 'nope'; its policies: vllm-default$",
    ):
        load_policy("impostor-dist:nope")


def test_the_fallback_batching_is_the_builtin_vllm_default_even_when_another_registers_the_name(install):
    install(IMPOSTOR, {"vllm-default": "Impostor"}, dist="impostor-dist")

    class VictimsOnly:
        name = "victims-only"

        @hookimpl
        def choose_preemption(self, step, requester):
            return None

    hooks = PolicyHooks(VictimsOnly)
    assert isinstance(hooks.pm.get_plugin("vllm-default-fallback"), VllmDefault)
    assert type(hooks.pm.get_plugin("vllm-default-fallback")).__name__ == "VllmDefault"


CLI_POLICIES = '''
raise_on_import = False


class Breaks(VllmDefault):
    """Its constructor raises."""

    def __init__(self):
        raise RuntimeError("constructor broke")


class Impostor(VllmDefault):
    """Not the real vllm-default."""
'''

# name: (arguments, what the one error line on stderr must contain)
CLI_CASES = {
    "SystemExit on import": (
        ["run", "-p", "exits", "-n", "5", "-q"],
        ["policy 'exits': its entry point cli_exits:Policy fails to load: SystemExit: 0", "cli-dist 0.1"],
    ),
    "SystemExit on import, serve": (
        ["serve", "-p", "exits"],
        ["policy 'exits': its entry point cli_exits:Policy fails to load: SystemExit: 0"],
    ),
    "a raising constructor": (
        ["run", "-p", "breaks", "-n", "5", "-q"],
        ["policy 'breaks': its constructor fails: RuntimeError: constructor broke (at ", "cli-dist 0.1"],
    ),
    "a raising constructor, compare": (
        ["compare", "-p", "fcfs", "-p", "breaks", "-n", "5", "--seeds", "1", "-q"],
        ["policy 'breaks': its constructor fails: RuntimeError: constructor broke"],
    ),
    "the duplicate name": (
        ["run", "-n", "5", "-q"],
        [
            "policy name 'vllm-default' is registered by 2 distributions: cli-dist 0.1 (cli_policies:Impostor), "
            "kvsched 0.1.0",
            "--policy cli-dist:vllm-default or --policy kvsched:vllm-default",
        ],
    ),
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    folder = make_dist(
        tmp_path_factory.mktemp("cli-dists"),
        "cli-dist",
        {"exits": "cli_exits:Policy", "breaks": "cli_policies:Breaks", "vllm-default": "cli_policies:Impostor"},
        {"cli_exits": "raise SystemExit(0)\n", "cli_policies": HEADER + CLI_POLICIES},
    )
    runs = {
        **{name: args for name, (args, _) in CLI_CASES.items()},
        "chosen": ["run", "-p", "kvsched:vllm-default", "-n", "5", "-q"],
        "policies": ["policies"],
    }
    with ThreadPoolExecutor(3) as pool:
        return dict(zip(runs, pool.map(lambda args: engine(folder, *args), runs.values())))


@pytest.mark.parametrize("case", list(CLI_CASES))
def test_the_console_script_says_what_broke_in_one_line_and_exits_2(cli, case):
    proc, expected = cli[case], CLI_CASES[case][1]
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    for text in expected:
        assert text in proc.stderr
    assert proc.stdout == ""


def test_the_console_script_runs_the_policy_chosen_as_dist_name(cli):
    proc = cli["chosen"]
    assert proc.returncode == 0, proc.stderr
    assert "policy kvsched:vllm-default" in proc.stdout and "5 / 0 / 0" in proc.stdout


def test_engine_policies_lists_both_distributions_and_shows_what_fails_to_load(cli):
    proc = cli["policies"]
    assert proc.returncode == 0, proc.stderr
    rows = [
        line.split("│")[1:3] for line in proc.stdout.splitlines() if line.startswith("│") and line.split("│")[1].strip()
    ]
    rows = {name.strip(): dist.strip() for name, dist in rows}
    assert rows["kvsched:vllm-default"] == "kvsched" and rows["cli-dist:vllm-default"] == "cli-dist"
    assert "vllm-default" not in rows and rows["fcfs"] == "kvsched" and rows["exits"] == "cli-dist"
    assert "(fails to load: policy 'exits': its entry point" in proc.stdout
    assert (
        "warning: vllm-default is registered by cli-dist and kvsched: choose one with --policy DIST:vllm-default"
        in proc.stdout
    )


def test_the_core_finds_its_mechanics_by_name_among_the_entry_points():
    """``core/`` imports no mechanics: ``EngineConfig.vllm_engine`` names an entry point of ``kvsched.mechanics``."""
    from importlib.metadata import entry_points

    from kvsched.core.mechanics import installed
    from kvsched.mechanics.engines import V0, V1

    registered = {ep.name: ep.value for ep in entry_points(group="kvsched.mechanics") if ep.dist.name == "kvsched"}
    assert registered == {"v0": "kvsched.mechanics.engines:V0", "v1": "kvsched.mechanics.engines:V1"}
    assert installed("v0") is V0 and installed("v1") is V1
    config = EngineConfig(num_gpu_blocks=64)
    assert Engine(config, "vllm-v1", SimulatedExecutor()).mechanics is V1
    assert Engine(config, "vllm-default", SimulatedExecutor()).mechanics is V0


@pytest.mark.parametrize("given", ["v1", 1, object()])
def test_mechanics_given_as_anything_but_mechanics_is_a_type_error(given):
    with pytest.raises(TypeError, match="mechanics must be Mechanics"):
        Engine(EngineConfig(num_gpu_blocks=64), "fcfs", SimulatedExecutor(), mechanics=given)


def test_an_entry_point_that_gives_other_mechanics_is_one_clear_error(monkeypatch):
    import kvsched.core.mechanics as seam
    from kvsched.mechanics.engines import V0

    monkeypatch.setattr(seam, "load_policy", lambda name, kind: V0 if kind == "mechanics" else None)
    with pytest.raises(PolicyError, match=r"mechanics 'v1': is Mechanics\(name='v0'.*not Mechanics of v1"):
        seam.installed.__wrapped__("v1")  # past the cache of the real entry point
    monkeypatch.setattr(seam, "load_policy", lambda name, kind: object())
    with pytest.raises(PolicyError, match="not Mechanics of v0"):
        seam.installed.__wrapped__("v0")
    monkeypatch.undo()
    with pytest.raises(UnknownPolicyError, match=r"^no mechanics 'v9' installed: reinstall kvsched \(make setup\)$"):
        seam.installed.__wrapped__("v9")  # the real lookup: no such entry point
