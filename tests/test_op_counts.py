"""benchmarks/op_counts.py: the bytecode count of a loop is the same on every run, and its diff names what changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from op_counts import diff  # noqa: E402


def test_a_loops_bytecodes_are_the_same_on_every_run_and_the_diff_names_the_function_that_changed(tmp_path):
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    runs = []
    for i in range(2):
        out = tmp_path / f"{i}.json"
        subprocess.run([sys.executable, BENCHMARKS / "op_counts.py", "engine", "40", out], check=True, env=env)
        runs.append(json.loads(out.read_text()))
    first, again = runs
    assert first == again and sum(first["ops"].values()) > 10_000
    assert first["calls"]["core/scheduler.py:schedule"] > 0
    slower = {"ops": Counter(first["ops"]), "calls": first["calls"]}
    slower["ops"]["core/scheduler.py:schedule"] += 500
    table = diff(first, slower, top=1)
    assert "| core/scheduler.py:schedule | +500 |" in table and "(+0.0" in table.splitlines()[0]
