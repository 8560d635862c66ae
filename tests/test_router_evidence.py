"""Routers compared and shown: ``engine compare --router A --router B`` over seeds with paired changes, a fleet's
``--plot`` report, fleet folders compared by their router, and the warning when no replica caches prefixes."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

ENGINE = str(Path(sys.executable).parent / "engine")
SESSIONS = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "sessions.json")


def engine(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([ENGINE, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_compare_routers_over_seeds_on_one_fleet(tmp_path):
    done = engine(
        "compare",
        "--router",
        "round-robin",
        "--router",
        "prefix-affinity",
        "-w",
        SESSIONS,
        "-n",
        "30",
        "--seeds",
        "2",
        "--replicas",
        "3",
        "-q",
        "-o",
        tmp_path / "cmp",
    )
    assert done.returncode == 0, done.stderr
    assert "3 replicas of vllm-v1" in done.stdout and "baseline round-robin." in done.stdout
    with open(tmp_path / "cmp" / "comparison.csv") as f:
        rows = {row["metric"]: row for row in csv.DictReader(f)}
    hits = rows["prefix hits (%)"]
    assert float(hits["prefix-affinity"].split()[0]) > float(
        hits["round-robin"].split()[0]
    )  # the router that aims for the cache finds it
    assert "prefix-affinity vs round-robin" in hits and hits["prefix-affinity vs round-robin"] != "–"


def test_a_router_comparison_refuses_what_does_not_apply():
    for args, message in (
        (["--router", "round-robin", "--router", "prefix-affinity", "-p", "fcfs", "-p", "lcf"], "one --policy"),
        (["-p", "fcfs", "-p", "lcf", "--replicas", "2"], "give two or more --router"),
        (["--router", "round-robin", "--router", "round-robin"], "two different --router"),
        (["--router", "round-robin", "--router", "nowhere"], "unknown router"),
    ):
        done = engine("compare", *args, "-n", "5", "--seeds", "1", "-q")
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
            args,
            done.stderr,
        )


def test_a_fleet_run_plots_its_report_and_compares_by_router(tmp_path):
    for router in ("round-robin", "prefix-affinity"):
        done = engine(
            "run",
            "-p",
            "vllm-v1",
            "--replicas",
            "3",
            "--router",
            router,
            "-w",
            SESSIONS,
            "-n",
            "30",
            "-q",
            "-o",
            tmp_path / router,
            "--plot",
        )
        assert done.returncode == 0, done.stderr
        page = (tmp_path / router / "report.html").read_text()
        for part in (
            'id="fleet"',
            'id="fig-load"',
            'id="fig-prefix-hits"',
            'id="fig-latency"',
            'id="fig-arrivals"',
            'id="reasons"',
        ):
            assert part in page, part
        assert f"3 replicas behind {router}" in page and "<script src" not in page
        assert json.loads((tmp_path / router / "summary.json").read_text())["fleet"]["router"] == router
    assert "router prefix-affinity · 3 replicas of vllm-v1" in done.stdout  # the summary's title names the router
    done = engine("compare", tmp_path / "round-robin", tmp_path / "prefix-affinity")
    assert done.returncode == 0, done.stderr
    assert "round-robin (router round-robin)" in done.stdout and "prefix hits (%)" in done.stdout
    assert engine("run", "--replicas", "2", "-n", "5", "--plot").returncode == 2


def test_a_fleet_without_prefix_caching_says_so():
    off = engine("run", "--replicas", "2", "--router", "prefix-affinity", "-w", SESSIONS, "-n", "10", "-q")
    on = engine(
        "run", "-p", "vllm-v1", "--replicas", "2", "--router", "prefix-affinity", "-w", SESSIONS, "-n", "10", "-q"
    )
    assert off.returncode == on.returncode == 0
    assert "prefix caching is off on every replica" in off.stdout and "prefix caching is off" not in on.stdout
