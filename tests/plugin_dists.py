"""Installed-looking test distributions: a module and a ``NAME-VERSION.dist-info`` folder (METADATA
and entry_points.txt) in one folder, which ``importlib.metadata`` finds like any pip-installed
package once the folder is on ``sys.path`` (in process) or ``PYTHONPATH`` (for ``engine``).

Not a test module; imported by tests/test_plugin_loading.py and tests/test_router_plugins.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ENGINE = str(Path(sys.executable).parent / "engine")
ROOT = Path(__file__).resolve().parents[1]


def make_dist(
    folder: Path,
    dist: str,
    policies: dict[str, str],
    modules: dict[str, str],
    version: str = "0.1",
    group: str = "kvsched.policies",
) -> Path:
    """Write ``modules`` (module name → source) and a distribution ``dist`` registering ``policies``
    (entry-point name → ``module:attr``) under ``group`` (``kvsched.policies``, or ``kvsched.routers``), into
    ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
    info = folder / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in policies.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    return folder


def engine(folder: Path, *args, timeout: int = 120) -> subprocess.CompletedProcess:
    """``.venv/bin/engine ARGS`` with the distributions in ``folder`` installed (on PYTHONPATH)."""
    paths = [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "COLUMNS": "200"}  # table rows unwrapped
    env.pop("KVSCHED_DEBUG", None)
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
