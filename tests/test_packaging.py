"""The root-mapped layout: every package folder is listed in pyproject, and nothing else is."""

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
NOT_PACKAGES = {"tests", "docs", "benchmarks", "plugins_example", ".venv", ".ci", ".git"}


def test_packages_list_matches_folders():
    """Every folder with an ``__init__.py`` is listed, and so is every data-only package (whose files
    ship as package data), so that setuptools has nothing to warn about."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {"kvsched", *setuptools["package-data"]}
    for init in ROOT.rglob("__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if (
            rel.parts
            and rel.parts[0] in NOT_PACKAGES
            or any(p.startswith(".") or p == "build" or p.endswith(".egg-info") for p in rel.parts)
        ):
            continue
        if rel.parts:
            found.add("kvsched." + ".".join(rel.parts))
    assert listed == found


def test_no_stray_root_modules():
    """A root *.py is installed as kvsched.<name> (conftest.py especially would be): only the
    package's own, ``kvsched.errors`` (the errors every package raises) and ``kvsched.rfc51608``, the RFC #51608
    adapter, meant to be imported so."""
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py", "errors.py", "rfc51608.py"]


def test_no_tests_package():
    assert not (ROOT / "tests" / "__init__.py").exists()
