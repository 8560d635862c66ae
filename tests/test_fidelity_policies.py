"""The sim-vs-real policy table (``benchmarks/fidelity_policies.py``, ``experiments/fidelity.py``): its gains,
signs, tolerances and errors, on small made-up summaries and on the recorded run the docs show.

A real run takes about an hour (a vLLM server starts in minutes on this machine, one per policy), too
long for a test; the recorded run's per-run summaries are rebuilt into the table here instead."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvsched.experiments import fidelity

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
RECORDED = sorted(
    FIGURES.glob("fidelity-policies*.json")
)  # the loaded run, the idle one, the one with a same-run profile


def summary(ttft_mean: float, ttft_p99: float | None = None, e2e_mean: float = 10.0, duration: float = 100.0) -> dict:
    return {
        "ttft_s": {"mean": ttft_mean, "p99": ttft_p99 or 2 * ttft_mean},
        "e2e_s": {"mean": e2e_mean},
        "tpot_s": {"mean": 0.1},
        "duration_s": duration,
    }


def runs(sim: dict[str, float], real: dict[str, list[float]]) -> list[dict]:
    return [
        {"policy": p, "label": p, "sim": summary(sim[p]), "real": summary(v), "errors": {}}
        for p, values in real.items()
        for v in values
    ]


def ttft_gains(sim, real) -> dict:
    return fidelity.build(runs(sim, real))[0]["policies"]


def test_a_gain_both_sides_see_agrees_in_sign_and_size():
    got = ttft_gains({"vllm-v1": 10.0, "a": 8.0}, {"vllm-v1": [5.0, 5.1], "a": [4.0]})
    assert got["a"]["simulated"] == pytest.approx(-0.2)
    assert got["a"]["measured"] == pytest.approx(4.0 / 5.05 - 1)
    assert got["a"]["measured_range"] == pytest.approx([4.0 / 5.1 - 1, 4.0 / 5.0 - 1])
    assert got["a"]["sign"] == "agrees" and got["a"]["size_agrees"]


def test_an_opposite_measured_gain_disagrees_and_a_far_one_is_outside_the_tolerance():
    got = ttft_gains({"vllm-v1": 10.0, "up": 8.0, "far": 5.0}, {"vllm-v1": [5.0], "up": [6.0], "far": [4.5]})
    assert got["up"]["sign"] == "disagrees" and not got["up"]["size_agrees"]
    assert got["far"]["sign"] == "agrees"  # both lower
    assert not got["far"]["size_agrees"]  # -10 % measured against -50 % simulated: more than 25 % of 50 points off
    assert got["far"]["tolerance"] == pytest.approx(0.125)


def test_a_measured_gain_inside_the_baselines_spread_is_no_effect():
    # the baseline's repeats differ by 10 %: a measured -5 % is noise, and agrees with a simulated 0
    board = fidelity.build(
        runs(
            {"vllm-v1": 10.0, "same": 10.0, "better": 7.0, "worse": 10.1},
            {"vllm-v1": [5.0, 5.5], "same": [5.0], "better": [5.0], "worse": [7.0]},
        )
    )[0]
    assert board["baseline_spread"] == pytest.approx(0.1)
    assert board["policies"]["same"]["sign"] == "agrees"
    assert (
        board["policies"]["better"]["sign"] == "noise"
    )  # the simulation's -30 % is an effect the measurement cannot confirm
    assert board["policies"]["worse"]["sign"] == "disagrees"  # +33 % measured where the simulation sees none (+1 %)


def test_the_errors_are_the_median_per_request_e2e_and_the_ttft_mean_and_p99(tmp_path):
    (tmp_path / "requests.csv").write_text("request_id,e2e,ttft\nr0,2.0,0.1\nr1,4.0,0.2\nr2,,\nr3,1.0,0.1\n")
    real = fidelity.by_request(tmp_path)
    assert real == {"r0": 2.0, "r1": 4.0, "r3": 1.0}  # an unfinished request has no E2E
    got = fidelity.sim_errors(summary(1.1, 2.4), summary(1.0, 2.0), {"r0": 2.2, "r1": 3.0, "r3": 1.0, "x": 9.0}, real)
    assert got["e2e_median"] == pytest.approx(0.1)  # of 10 %, 25 % and 0 %
    assert got["ttft_mean"] == pytest.approx(0.1) and got["ttft_p99"] == pytest.approx(0.2)
    assert got["matched_requests"] == 3


def test_a_tiered_workload_compares_each_class_mean_ttft_and_an_untiered_one_does_not(tmp_path):
    (tmp_path / "requests.csv").write_text("request_id,e2e,ttft\na,3,1.0\nb,3,3.0\nc,9,8.0\nd,,\n")
    classes = {"a": "interactive", "b": "interactive", "c": "batch", "d": "interactive"}
    got = fidelity.class_means(fidelity.by_request(tmp_path, "ttft"), classes)
    assert got == {"ttft_batch_s": {"mean": 8.0}, "ttft_interactive_s": {"mean": 2.0}}  # d never started: not counted
    assert fidelity.class_means({"a": 1.0}, {"a": None}) == {}  # no class, no group
    tiered = runs({"vllm-v1": 10.0, "sla-tiers": 11.0}, {"vllm-v1": [5.0], "sla-tiers": [5.5]})
    for run, (sim, real) in zip(tiered, [(4.0, 2.0), (1.0, 0.6)]):
        run["sim"]["ttft_interactive_s"], run["real"]["ttft_interactive_s"] = {"mean": sim}, {"mean": real}
    board = {gains["metric"]: gains["policies"]["sla-tiers"] for gains in fidelity.build(tiered)}
    assert board["interactive ttft_mean"]["simulated"] == pytest.approx(-0.75)
    assert (
        board["interactive ttft_mean"]["measured"] == pytest.approx(-0.7)
        and board["interactive ttft_mean"]["sign"] == "agrees"
    )
    assert board["ttft_mean"]["simulated"] == pytest.approx(0.1)  # worse overall: the classes' trade
    assert "interactive ttft_mean" not in {
        g["metric"] for g in fidelity.build(runs({"vllm-v1": 1.0}, {"vllm-v1": [1.0]}))
    }


def test_a_run_slower_throughout_has_the_same_ttft_in_makespans():
    sim = {"vllm-v1": summary(10.0, duration=100.0), "a": summary(8.0, duration=100.0)}
    real = {
        "vllm-v1": [summary(20.0, duration=200.0)],
        "a": [summary(24.0, duration=300.0)],
    }  # a's run: a machine 1.5× slower
    board = fidelity.build(
        [{"policy": p, "label": p, "sim": sim[p], "real": r, "errors": {}} for p in real for r in real[p]]
    )
    raw, per_makespan = board[0]["policies"]["a"], board[-1]["policies"]["a"]
    assert board[-1]["metric"] == "ttft_mean/makespan"
    assert raw["measured"] == pytest.approx(0.2) and raw["sign"] == "disagrees"
    assert (
        per_makespan["measured"] == pytest.approx(-0.2)
        and per_makespan["sign"] == "agrees"
        and per_makespan["size_agrees"]
    )


def test_misses_are_bold_in_the_errors_table():
    run = {
        "label": "p",
        "sim": summary(1.0),
        "real": summary(1.0),
        "errors": {"e2e_median": 0.08, "ttft_mean": -0.05, "ttft_p99": 0.25},
    }
    row = fidelity.errors_table([run])[2]
    assert "**8.0 %**" in row and "| -5.0 % |" in row and "**+25.0 %**" in row


def test_the_baseline_is_served_first_in_the_middle_and_last():
    spec = importlib.util.spec_from_file_location("fidelity_policies", ROOT / "benchmarks" / "fidelity_policies.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    order = module.schedule(["vllm-v1", *module.PROPOSALS], 3)
    assert order[0] == order[5] == order[-1] == "vllm-v1" and order.count("vllm-v1") == 3
    assert sorted(set(order) - {"vllm-v1"}) == sorted(module.PROPOSALS) and len(order) == 11


@pytest.mark.parametrize("recorded", RECORDED, ids=lambda p: p.stem)
def test_the_recorded_table_is_rebuilt_from_its_runs(recorded, tmp_path):
    from kvsched.workloads import build_workload

    result = json.loads(recorded.read_text())
    assert fidelity.build(result["runs"]) == result["gains"]
    assert fidelity.markdown(result) == recorded.with_suffix(".md").read_text()
    (tmp_path / "workload.json").write_text(json.dumps(result["workload"]))
    count = sum(1 for _ in build_workload(str(tmp_path / "workload.json")).iter_requests())
    for run in result["runs"]:  # every run measured the whole workload
        assert run["real"]["finished"] == run["sim"]["finished"] == count


def test_the_sessions_tables_simulated_side_is_what_the_simulator_gives_today(tmp_path, monkeypatch):
    """The recorded tiered-sessions run re-simulated with its profile: the same summaries, and session-affinity
    the same as vllm-v1 request by request (its rule never fires there: the head has always waited too long,
    or no warm turn stands behind it), as docs/policies/session-affinity.md says."""
    spec = importlib.util.spec_from_file_location("fidelity_policies", ROOT / "benchmarks" / "fidelity_policies.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from kvsched.executors.profiles import resolve_profile

    recorded = json.loads((FIGURES / "fidelity-policies-sessions.json").read_text())
    assert recorded["workload"] == module.TIERED_SESSIONS
    profile = resolve_profile(str(FIGURES / "fidelity-sessions-profile.json"))
    assert {k: getattr(profile, k) for k in ("base_ms", "prefill_token_ms", "decode_seq_ms", "kv_token_ms")} == {
        k: recorded["profile"][k] for k in ("base_ms", "prefill_token_ms", "decode_seq_ms", "kv_token_ms")
    }
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(module.TIERED_SESSIONS))
    from itertools import chain

    from kvsched.policies import proposals
    from kvsched.policies.session_affinity import SessionAffinity

    seen = {"queued": 0, "head_waited_too_long": 0, "promoted": 0}
    order_waiting = SessionAffinity.order_waiting

    def counted(self, step):  # what docs/fidelity.md counts: steps with a queue, and why none promotes
        waiting = step.waiting
        if waiting:
            seen["queued"] += 1
            seen["head_waited_too_long"] += proposals.waited(step, waiting[0]) > self.max_head_wait_s
        order = order_waiting(self, step)
        seen["promoted"] += isinstance(order, chain)
        return order

    monkeypatch.setattr(SessionAffinity, "order_waiting", counted)
    sims = {
        policy: module.simulate_run(workload, recorded["kv_blocks"], profile, policy)
        for policy in dict.fromkeys(run["policy"] for run in recorded["runs"])
    }
    for run in recorded["runs"]:
        assert sims[run["policy"]].summary["ttft_s"] == pytest.approx(run["sim"]["ttft_s"], rel=1e-9)
        assert sims[run["policy"]].summary["duration_s"] == pytest.approx(run["sim"]["duration_s"], rel=1e-9)

    def ttfts(policy):
        return {r.request_id: r.ttft for r in sims[policy].requests}

    assert ttfts("session-affinity") == ttfts("vllm-v1")
    assert seen == {"queued": 308, "head_waited_too_long": 283, "promoted": 0}
    assert ttfts("hrrn") != ttfts("vllm-v1")  # the workload has a queue to reorder


@pytest.mark.parametrize(
    "args, says",
    [
        (["--workload", "missing.json"], "missing.json: cannot read workload spec"),
        (["--workload", "bad.json"], "bad.json:1: not UTF-8 text"),
        (["--workload", "tiered-sessions", "--requests", "5"], "--requests sizes the default workload only"),
        (["--kv-blocks", "0"], "must be from 1 to 1,000,000, got 0"),
        (["--repeats", "-5"], "--repeats: must be from 1 to 20, got -5"),
        (["--repeats", str(10**9)], "--repeats: must be from 1 to 20, got 1000000000"),
        (["--policies", "vllm-v1,nope"], "unknown policy 'nope'"),
        (["--order", "vllm-v1,nope,vllm-v1"], "unknown policy 'nope'"),
        (["--profile", "nope"], "unknown cost profile 'nope'"),
        (["--out", "bad.json"], "--out bad.json: is a file, not a folder"),
        (["--out", "saved", "--resume"], "saved/fidelity-policies.json:1: not valid JSON"),
        (
            ["--out", "shapeless", "--resume"],
            "--resume: shapeless/fidelity-policies.json holds no runs as this script writes them",
        ),
        (
            ["--out", "unlabelled", "--resume"],
            "--resume: unlabelled/fidelity-policies.json holds no runs as this script writes them",
        ),
    ],
)
def test_a_bad_fidelity_run_is_a_usage_error_before_any_server_starts(tmp_path, args, says):
    """Once an unknown policy or profile, an --out that is a file or a damaged --resume file gave tracebacks,
    and --repeats -5 or a --resume file of another shape ran on (exit 0)."""
    import subprocess
    import sys

    (tmp_path / "bad.json").write_bytes(b"\xff\xfe")
    unlabelled = '{"runs": [{"policy": "vllm-v1", "label": 7, "sim": {}, "real": {}, "errors": {}}]}'
    for folder, text in (("saved", "{not json"), ("shapeless", '{"runs": 5}'), ("unlabelled", unlabelled)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "fidelity-policies.json").write_text(text)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "fidelity_policies.py"),
            "--out",
            str(tmp_path / "out"),
            "--workdir",
            str(tmp_path / "work"),
            *args,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "work" / "calibration").exists()  # no server was started


def test_a_resume_with_every_run_saved_rebuilds_the_tables_without_a_server(tmp_path):
    """Once the first server was asked of an empty order (an IndexError)."""
    import shutil
    import subprocess
    import sys

    recorded = json.loads((ROOT / "docs" / "figures" / "fidelity-policies.json").read_text())
    (tmp_path / "out").mkdir()
    shutil.copy(ROOT / "docs" / "figures" / "fidelity-policies.json", tmp_path / "out")
    order = ",".join(r["policy"] for r in recorded["runs"])
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "fidelity_policies.py"),
            "--out",
            str(tmp_path / "out"),
            "--workdir",
            str(tmp_path / "work"),
            "--resume",
            "--order",
            order,
            "--profile",
            "smollm2-135m-vllm-cpu",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert not list((tmp_path / "work").glob("server-*.log"))  # no server was started
    rebuilt = json.loads((tmp_path / "out" / "fidelity-policies.json").read_text())
    assert rebuilt["runs"] == recorded["runs"] and rebuilt["gains"] == recorded["gains"]
    assert (tmp_path / "out" / "fidelity-policies.md").read_text() == fidelity.markdown(rebuilt)
