"""pytest plugin (entry point ``pytest11``): ``--policy NAME`` for ``pytest --pyargs kvsched.testing``.

Loaded by every pytest run in an environment where kvsched is installed, so it imports nothing
of kvsched at module level; the suite itself is imported only by the tests that use it.
"""

from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kvsched", "kvsched policy conformance")
    group.addoption(
        "--policy",
        action="append",
        default=[],
        metavar="NAME",
        help="policy to check with kvsched.testing (installed name, file.py:Attr or module:Attr); repeatable",
    )
    group.addoption(
        "--policy-opt",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="constructor option for the policies under check; repeatable",
    )


def pytest_generate_tests(metafunc) -> None:
    if "kvsched_policy" in metafunc.fixturenames:
        names = metafunc.config.getoption("policy") or [None]
        metafunc.parametrize("kvsched_policy", names, ids=[n or "no-policy" for n in names])


def policy_options(config) -> dict[str, str]:
    """``--policy-opt KEY=VALUE`` pairs as a dict (values stay strings, as from the CLI)."""
    out = {}
    for pair in config.getoption("policy_opt") or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--policy-opt expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out
