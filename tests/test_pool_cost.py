"""benchmarks/pool_cost.py replays exactly the pool calls of its run: its "alone" figures are of the same work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "pool_cost.py"


def test_the_replay_handles_the_blocks_the_run_handled():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--workload", "long-context", "-n", "80"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    in_run, alone = result["in_run"], result["alone"]
    assert set(in_run) == {"register", "allocate_many", "forget", "release_many"}
    assert {name: figures["blocks"] for name, figures in in_run.items()} == {
        name: figures["blocks"] for name, figures in alone.items()
    }
    assert all(figures["blocks"] > 0 for figures in in_run.values())  # 80 long prompts fill the pool: it evicts
