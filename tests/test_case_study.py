"""The seed's case study: one command reproduces it, and docs/case-study.md holds its table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_case_study_command_prints_the_three_configurations():
    proc = subprocess.run(
        [sys.executable, "benchmarks/case_study.py", "--no-write", "--num-requests", "400", "--rates", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {
        line.split("|")[1].strip()[0]: [c.strip() for c in line.split("|")[1:-1]]
        for line in proc.stdout.splitlines()
        if line.startswith("| A") or line.startswith("| B") or line.startswith("| C")
    }
    assert set(rows) == {"A", "B", "C"}
    assert rows["A"][1] == "vllm-default" and rows["C"][1] == "priority-vip"
    vip_p99 = {k: float(v[4]) for k, v in rows.items()}
    assert vip_p99["C"] < vip_p99["A"]  # the VIP tier gets its first token sooner


def test_docs_hold_the_table_and_the_command():
    doc = (ROOT / "docs" / "case-study.md").read_text()
    results = doc.split("<!-- results:start -->")[1].split("<!-- results:end -->")[0]
    assert "Command: `python benchmarks/case_study.py`" in results
    assert (
        results.count("| A: delay 2.0, budget 2048 |") >= 2 and "| C: delay 1.0, budget 2048, priority-vip |" in results
    )
    assert (ROOT / "docs" / "case-study.png").stat().st_size > 10_000
