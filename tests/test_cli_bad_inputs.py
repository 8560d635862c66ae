"""Every class of bad input, through the console script: one line on stderr, exit status 2, no
traceback, found before any simulating, and nothing partial left where results would go.

The cases run concurrently (a module fixture), each then judged by its own test. Policies that
misbehave come from a throw-away distribution (a ``.dist-info`` folder on PYTHONPATH), so that
they are found by name like any installed policy.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ENGINE = str(Path(sys.executable).parent / "engine")
ROOT = Path(__file__).resolve().parents[1]

POLICIES = """
from kvsched import hookimpl
from kvsched.policies.vllm_default import VllmDefault


class RaisesOnStep(VllmDefault):
    name = "raises-on-step"

    @hookimpl
    def on_step(self, report):
        raise RuntimeError("the observer broke")


class HugeAnswer(VllmDefault):
    name = "huge-answer"

    @hookimpl
    def can_allocate(self, step, group):
        return list(range(10**6))


NOT_A_POLICY = False
"""
ENTRY_POINTS = """[kvsched.policies]
raises-on-step = hostile_cli_policies:RaisesOnStep
huge-answer = hostile_cli_policies:HugeAnswer
is-false = hostile_cli_policies:NOT_A_POLICY
fails-to-import = hostile_cli_no_such_module:Policy
"""


def _file_size_limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


# name: (arguments, text of the one error line, paths (under tmp) that must not exist afterwards)
CASES = {
    "output is a file": (
        ["run", "-n", "5", "-o", "{tmp}/a-file"],
        "--output {tmp}/a-file: is a file, not a folder",
        [],
    ),
    "output under a file": (
        ["run", "-n", "5", "-o", "{tmp}/a-file/out"],
        "{tmp}/a-file is a file, so nothing can be written under it",
        [],
    ),
    "output not writable": (
        ["run", "-n", "5", "-o", "/proc/kvsched-out"],
        "--output /proc/kvsched-out: cannot write under /proc: No such file or directory",
        [],
    ),
    "summary.json is a folder": (["run", "-n", "5", "-o", "{tmp}/taken"], "summary.json there is a folder", []),
    "disk full": (
        ["run", "-n", "60", "-o", "{tmp}/full"],
        "cannot write results to {tmp}/full: File too large",
        ["full"],
    ),
    "compare output under a file": (
        ["compare", "-p", "fcfs", "-p", "sjf", "-n", "5", "-o", "{tmp}/a-file/cmp", "--plot"],
        "--output {tmp}/a-file/cmp: {tmp}/a-file is a file",
        [],
    ),
    "serve KV cache past any machine": (["serve", "--kv-cache-gib", "inf"], "Invalid value for '--kv-cache-gib'", []),
    "compare plot without a folder": (
        ["compare", "-p", "fcfs", "-p", "sjf", "-n", "5", "--plot"],
        "--plot needs --output DIR",
        [],
    ),
    "calibrate output under a file": (
        ["calibrate", "{tmp}/steps.csv", "-o", "{tmp}/a-file/p.json"],
        "--output {tmp}/a-file/p.json: {tmp}/a-file is a file",
        [],
    ),
    "prompt of 2**63 tokens": (
        ["run", "--trace", "{tmp}/huge-prompt.csv", "-o", "{tmp}/o1"],
        "huge-prompt.csv:2: column 'prompt_tokens': must be <= 2147483648",
        ["o1"],
    ),
    "priority 1e20": (
        ["run", "--trace", "{tmp}/huge-priority.csv", "-o", "{tmp}/o2"],
        "huge-priority.csv:2: column 'priority': must be <= 2147483647",
        ["o2"],
    ),
    "spec with a 2**63-token prompt": (
        ["run", "-w", "{tmp}/huge-prompt.json", "-o", "{tmp}/o3"],
        "huge-prompt.json: invalid workload spec: SyntheticSpec.prompt.fixed.value: Input should be less than or "
        "equal to 2147483648",
        ["o3"],
    ),
    "1e20 GPU blocks": (
        ["run", "--set", f"num_gpu_blocks={10**20}"],
        "num_gpu_blocks: Input should be less than or equal to 4194304",
        [],
    ),
    "on_step raises": (
        ["run", "--policy", "raises-on-step", "-n", "5", "-o", "{tmp}/o4"],
        "policy 'raises-on-step' in on_step: raised RuntimeError: the observer broke (at "
        "{plugins}/hostile_cli_policies.py:11)",
        ["o4"],
    ),
    "entry point fails to import": (
        ["run", "--policy", "fails-to-import"],
        "policy 'fails-to-import': its entry point hostile_cli_no_such_module:Policy fails to load: "
        "ModuleNotFoundError",
        [],
    ),
    "entry point is False": (
        ["run", "--policy", "is-false", "-n", "5"],
        "policy 'is-false': is False, not a policy class, instance or module",
        [],
    ),
    "a huge answer": (
        ["run", "--policy", "huge-answer", "-n", "5"],
        "policy 'huge-answer' in can_allocate: returned [0, 1, 2, 3, ...], expected an AllocStatus",
        [],
    ),
    "rate 0": (["run", "--rate", "0"], "--rate must be a positive number of requests per second, got 0.0", []),
    "1e20 requests": (["run", "-n", "100000000000000000000"], "--num-requests must be between 1 and 10,000,000", []),
    "SLO inf": (["run", "-n", "5", "--slo-ttft", "inf"], "--slo-ttft must be a finite number, got inf", []),
    "spec error names the file": (
        ["run", "-w", "{tmp}/no-requests.json"],
        "no-requests.json: invalid workload spec: SyntheticSpec.num_requests: Input should be greater than or equal "
        "to 1",
        [],
    ),
    "duplicate CSV column": (
        ["run", "--trace", "{tmp}/twice.csv"],
        "twice.csv:1: column(s) 'prompt_tokens' appear more than once in the header",
        [],
    ),
    "swept and fixed": (
        ["sweep", "--set", "delay_factor=0,1", "--fix", "delay_factor=2", "-o", "{tmp}/o5"],
        "delay_factor: both swept (--set) and fixed (--fix)",
        ["o5"],
    ),
    "empty tenant in a spec": (
        ["run", "-w", "{tmp}/empty-tenant.json"],
        "empty-tenant.json: invalid workload spec: SyntheticSpec.tenants.[key]: String should have at least 1 "
        "character",
        [],
    ),
    "a usage error": (["run", "-n", "many"], "engine run: Invalid value for '--num-requests' / '-n'", []),
    "unknown --set key": (
        ["run", "--set", "delay=1"],
        "--set: unknown engine setting 'delay'; valid: block_size, num_gpu_blocks, num_cpu_blocks, watermark",
        [],
    ),
    "bad policy option value": (
        ["run", "-p", "priority-vip", "--policy-opt", "aging_s=abc"],
        "--policy-opt aging_s=abc: Input should be a valid number, unable to parse string as a number (policy "
        "priority-vip's option aging_s is float)",
        [],
    ),
    "unknown policy option": (
        ["run", "-p", "sarathi", "--policy-opt", "budget=5"],
        "--policy-opt budget=5: policy sarathi has no option 'budget'; its options: token_budget",
        [],
    ),
    "bad policy option in compare": (
        ["compare", "-p", "fcfs", "-p", "sjf", "--policy-opt", "sjf.sigma=wide"],
        "--policy-opt sjf.sigma=wide: Input should be a valid number",
        [],
    ),
    "--cv without gamma": (
        ["run", "--cv", "2"],
        "--cv is the burstiness of gamma arrivals: give it with --arrival gamma",
        [],
    ),
    "gamma on the embedded job": (
        ["run", "--arrival", "gamma", "--cv", "2"],
        "the embedded default job has Poisson arrivals",
        [],
    ),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-inputs")
    plugins = tmp / "plugins"
    (plugins / "hostile_cli-0.1.dist-info").mkdir(parents=True)
    (plugins / "hostile_cli-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hostile-cli\nVersion: 0.1\n"
    )
    (plugins / "hostile_cli-0.1.dist-info" / "entry_points.txt").write_text(ENTRY_POINTS)
    (plugins / "hostile_cli_policies.py").write_text(POLICIES)
    (tmp / "a-file").write_text("not a folder\n")
    (tmp / "taken" / "summary.json").mkdir(parents=True)
    (tmp / "steps.csv").write_text(
        "prefill_tokens,decode_seqs,kv_tokens_read,blocks_swapped,blocks_copied,duration_s\n"
        + "".join(f"{10 * i},{i % 3},{100 * i},0,0,{0.01 + 0.001 * i}\n" for i in range(1, 9))
    )
    (tmp / "huge-prompt.csv").write_text(f"arrival_time_s,prompt_tokens,output_tokens\n0,{2**63},1\n")
    (tmp / "huge-priority.csv").write_text(
        "arrival_time_s,prompt_tokens,output_tokens,priority\n0,5,1,100000000000000000000\n"
    )
    (tmp / "twice.csv").write_text("arrival_time_s,prompt_tokens,output_tokens,prompt_tokens\n0,5,1,6\n")
    (tmp / "huge-prompt.json").write_text(
        json.dumps({"kind": "synthetic", "prompt": {"kind": "fixed", "value": 2**63}})
    )
    (tmp / "no-requests.json").write_text(json.dumps({"kind": "synthetic", "num_requests": 0}))
    (tmp / "empty-tenant.json").write_text(json.dumps({"kind": "synthetic", "tenants": {"": 1.0}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}

    def run(name):
        args, _, _ = CASES[name]
        return subprocess.run(
            [ENGINE, *(a.format(tmp=tmp) for a in args), "-q"]
            if args[0] == "run"
            else [ENGINE, *(a.format(tmp=tmp) for a in args)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=env,
            preexec_fn=_file_size_limit if name == "disk full" else None,
        )

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(CASES, pool.map(run, CASES)))
    return tmp, plugins, done


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2_before_simulating_and_leaves_nothing(results, name):
    tmp, plugins, done = results
    proc, (_, expected, absent) = done[name], CASES[name]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (name, proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (name, proc.stderr[-2000:])
    assert expected.format(tmp=tmp, plugins=plugins) in lines[0], (name, lines[0])
    assert len(lines[0]) < 1100 and "Traceback" not in proc.stderr
    assert "simulated" not in proc.stdout or name in ("on_step raises", "disk full")  # found before any simulating
    for path in absent:
        assert not (tmp / path).exists(), f"{name}: {path} was left behind"
    if name == "disk full":
        assert not [p for p in tmp.iterdir() if p.name.startswith(".full.")], "a staging folder was left behind"


def engine(*args, env=None):
    return subprocess.run(
        [ENGINE, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_debug_anywhere_on_the_line_or_in_the_environment_shows_the_traceback():
    proc = engine("run", "--set", "watermark=2", "--debug")
    assert (
        proc.returncode == 2
        and "Traceback" in proc.stderr
        and proc.stderr.strip().splitlines()[-1].startswith("error: ")
    )
    proc = engine("run", "--set", "watermark=2", env={"KVSCHED_DEBUG": "1"})
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_a_new_run_replaces_every_result_file_of_an_old_one(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("summary.json", "report.html", "latency_cdf.png", "queues_kv.png", "batch_composition.png"):
        (out / name).write_text("from an earlier run with --plot\n")
    (out / "notes.txt").write_text("mine\n")
    proc = engine("run", "-n", "7", "-o", out, "-q")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text())["num_requests"] == 7
    assert sorted(p.name for p in out.iterdir()) == [
        "decisions.parquet",
        "notes.txt",
        "requests.csv",
        "requests.parquet",
        "summary.json",
        "timeseries.parquet",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_check_shows_the_fail_table_for_a_policy_that_fails_its_starvation_claim():
    proc = engine(
        "check",
        "--policy",
        "tests/broken_policies.py:RaisesClaimingStarvationFree",
        "--examples",
        "6",
        "--steps",
        "5",
        "--starvation-examples",
        "1",
        "--shrink-seconds",
        "2",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "conformance of broken-raises-claiming-starvation-free" in proc.stdout
    assert (
        "starvation-free: the policy failed in the overload scenario" in proc.stdout
        and "OverloadScenario(" in proc.stdout
    )
    assert "starvation-free" in proc.stdout.split("failed:")[-1] and "Traceback" not in proc.stderr


def test_check_of_a_policy_that_passes_nan_is_a_fail_row_not_a_cryptic_error():
    proc = engine(
        "check",
        "--policy",
        "tests/broken_policies.py:ChunksByNaN",
        "--examples",
        "6",
        "--steps",
        "5",
        "--starvation-examples",
        "1",
        "--shrink-seconds",
        "2",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "max_tokens must be a positive integer or None, got nan" in proc.stdout
    assert "five minutes" not in proc.stdout + proc.stderr and "error:" not in proc.stderr
