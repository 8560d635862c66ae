"""Every option of every ``engine`` command, in every mode of the command, applies or is refused.

The options are read from the commands themselves (typer's click objects), so a new option fails
``test_every_option_of_every_mode_is_placed`` until this file says where it applies. In each mode
(one engine simulated or on a real model, a fleet, a fleet spec, a sweep on processes or on Ray, a
leaderboard with or without a served engine, compare on policies or on result folders, explain on
a run or a fleet) an option the mode does not read is refused: one line naming it, exit 2, before
any work; the options it reads are given together in runs that must succeed. Options that were
taken and silently ignored (issue 36: ``--replicas 2 --executor hf`` ran a simulation; ``--fleet``
dropped ``--policy``, ``--set`` and ``--profile``) are each one refusal below.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import typer.main
from test_bench_hostile import MODEL as LIAR_MODEL
from test_bench_hostile import Liar
from typer.testing import CliRunner

from kvsched.cli.app import (
    FLEET_OPTIONS,
    FLEET_SPEC_FIELDS,
    GPU_OPTIONS,
    HF_OPTIONS,
    ONE_ENGINE_OUTPUTS,
    SIM_OPTIONS,
    app,
)
from kvsched.cli.calibrate import GPU_FIT_OPTIONS, STEP_FIT_OPTIONS

GROUP = typer.main.get_command(app)
COMMANDS = {"engine": GROUP, **GROUP.commands}
OPT = "{opt}"  # where in a mode's arguments an option goes (else at the end)
FLEETS = frozenset({"replicas", "prefill_replicas", "decode_replicas", "fleet_spec"})  # they make `engine run` a fleet


@dataclass
class Mode:
    command: str
    name: str
    base: list[str]  # the arguments that put the command in this mode (OPT where options go, if not at the end)
    refused: frozenset[str] = frozenset()  # options (parameter names) the mode does not read
    runs: list[list[str]] = field(default_factory=list)  # together, every other option: each run must succeed
    switches: frozenset[str] = frozenset()  # options that put the command in another mode (placed there)
    refuses: list[list[str]] = field(default_factory=list)  # values refused of an option read with others
    elsewhere: str = ""  # where its runs are exercised instead (a test that needs what a fast one cannot start)


EXECUTOR_HF = ["--executor", "hf"]  # a fleet reads --executor sim
TRACE = "{tmp}/trace.csv"
SPEC = "{tmp}/synthetic.json"
PROFILE = ["--profile", "llama2-7b-a100"]
VTC = ["--policy", "vtc", "--policy-opt", "input_weight=2"]
ROUTED = ["--router", "power-of-two", "--router-opt", "seed=3", "--staleness", "0.01"]
WORKLOAD_OPTIONS = ["--workload", "synthetic", "--seed", "3", "--rate", "40", "--arrival", "gamma", "--cv", "2"]
TRACE_OPTIONS = ["--trace", TRACE, "--rate-scale", "2", "--start-offset", "0.05"]
SLO = ["--slo-ttft", "1", "--slo-tpot", "0.1"]
ONE_FLEET = HF_OPTIONS | ONE_ENGINE_OUTPUTS | GPU_OPTIONS  # what no fleet reads
RUN = (
    Path(__file__).resolve().parents[1]
    / "benchmarks"
    / "data"
    / "blis-h100"
    / "20260218-150956-codellama-34b-tp2-codegen"
)
GPU_SWITCHES = frozenset({"hardware", "model_config"})  # they make `engine run` derive its cost model
COMPARE_RUNS = frozenset(
    {
        "policy",
        "policy_opt",
        "set_",
        "workload",
        "trace",
        "seed",
        "seeds",
        "num_requests",
        "rate",
        "profile",
        "router",
        "replicas",
        "staleness",
    }
)  # compare's own runs: result folders have none

MODES = [
    Mode(
        "engine",
        "alone",
        [],
        runs=[
            [
                *VTC,
                "--set",
                "max_num_seqs=8",
                "--seed",
                "2",
                "-n",
                "6",
                "--rate",
                "30",
                *PROFILE,
                "-o",
                "{tmp}/alone",
                "-q",
                "--debug",
            ]
        ],
    ),
    Mode(
        "engine",
        "before a command",
        [OPT, "routers"],
        refused=frozenset(p.name for p in GROUP.params) - {"debug"},
        runs=[["--debug"]],
    ),
    Mode(
        "run",
        "one simulated engine",
        ["run", "-n", "6", "-q"],
        refused=HF_OPTIONS | FLEET_OPTIONS - FLEETS | GPU_OPTIONS - GPU_SWITCHES,
        switches=FLEETS | GPU_SWITCHES,
        runs=[
            [
                "--executor",
                "sim",
                *VTC,
                "--set",
                "max_num_seqs=8",
                *WORKLOAD_OPTIONS,
                *PROFILE,
                *SLO,
                "-o",
                "{tmp}/sim",
                "--plot",
                "--decision-log",
                "--trace-out",
                "{tmp}/trace-out.json",
            ],
            [*TRACE_OPTIONS, "-o", "{tmp}/sim2", "--no-decision-log"],
        ],
    ),
    Mode(
        "run",
        "one engine on a GPU's roofline",
        ["run", "-n", "6", "-q", "--hardware", "h100-sxm", "--model-config", "llama-3.1-8b"],
        refused=HF_OPTIONS | FLEET_OPTIONS - FLEETS | {"profile"},
        switches=FLEETS,
        runs=[
            [
                "--executor",
                "sim",
                *VTC,
                "--set",
                "max_num_seqs=8",
                *WORKLOAD_OPTIONS,
                *SLO,
                "-o",
                "{tmp}/gpu",
                "--plot",
                "--decision-log",
                "--trace-out",
                "{tmp}/gpu-trace.json",
                "--tp",
                "2",
                "--dtype",
                "fp8",
                "--gpu-memory-utilization",
                "0.85",
            ],
            [*TRACE_OPTIONS, "-o", "{tmp}/gpu2", "--no-decision-log"],
        ],
    ),
    Mode(
        "run",
        "a real model",
        [
            "run",
            "--executor",
            "hf",
            "--model",
            "tiny-gpt2",
            "--max-tokens",
            "2",
            "-q",
            "--set",
            "num_gpu_blocks=64",
            "--set",
            "block_size=8",
        ],
        refused=SIM_OPTIONS | FLEET_OPTIONS - FLEETS,
        switches=FLEETS,
        runs=[
            [*VTC, "-n", "2", "--rate", "50", "--seed", "1", "--temperature", "0.5", "-o", "{tmp}/hf"],
            ["--prompt", "Hello"],
        ],
    ),
    Mode(
        "run",
        "a real model given prompts",
        ["run", "--executor", "hf", "--prompt", "Hi", "-q"],
        refused=frozenset({"num_requests"}),
        elsewhere="the mode 'a real model' above",
    ),
    Mode(
        "run",
        "a fleet",
        ["run", "--replicas", "2", "-n", "6", "-q"],
        refused=ONE_FLEET | FLEETS - {"replicas"} | {"transfer_gbps"},
        refuses=[EXECUTOR_HF],
        runs=[
            [
                "--executor",
                "sim",
                *ROUTED,
                "--policy",
                "lcf",
                "--policy-opt",
                "victim=lifo",
                "--set",
                "max_num_seqs=8",
                *PROFILE,
                *WORKLOAD_OPTIONS,
                "-o",
                "{tmp}/fleet",
                "--plot",
            ],
            TRACE_OPTIONS,
        ],
    ),
    Mode(
        "run",
        "a P/D fleet",
        ["run", "--prefill-replicas", "1", "--decode-replicas", "1", "-n", "6", "-q"],
        refused=ONE_FLEET | {"replicas", "fleet_spec"},
        refuses=[EXECUTOR_HF],
        runs=[
            [
                "--executor",
                "sim",
                "--transfer-gbps",
                "10",
                *ROUTED,
                *VTC,
                "--set",
                "max_num_seqs=8",
                *PROFILE,
                *WORKLOAD_OPTIONS,
                "-o",
                "{tmp}/pd",
                "--plot",
            ],
            TRACE_OPTIONS,
        ],
    ),
    Mode(
        "run",
        "a fleet spec",
        ["run", "--fleet", "{tmp}/fleet.json", "-n", "6", "-q"],
        refused=ONE_FLEET | FLEET_SPEC_FIELDS | FLEETS - {"fleet_spec"} | {"transfer_gbps"},
        refuses=[EXECUTOR_HF],
        runs=[["--executor", "sim", *ROUTED, *WORKLOAD_OPTIONS, "-o", "{tmp}/spec", "--plot"], TRACE_OPTIONS],
    ),
    Mode(
        "sweep",
        "a process pool",
        ["sweep", "-q", "-n", "6", "-o", "{tmp}/sweep"],
        switches=frozenset({"ray", "ray_address"}),
        refused=frozenset({"ray_timeout"}),
        runs=[
            [
                "-p",
                "fcfs",
                "-p",
                "lcf",
                "--set",
                "max_num_seqs=4,8",
                "--fix",
                "num_gpu_blocks=512",
                *WORKLOAD_OPTIONS,
                *PROFILE,
                *SLO,
                "-j",
                "1",
            ],
            TRACE_OPTIONS,
        ],
    ),
    Mode(
        "sweep",
        "a Ray cluster",
        ["sweep", "-q", "-n", "6", "--ray-address", "127.0.0.1:9", "-o", "{tmp}/sweep-ray"],
        refused=frozenset({"workers"}),
        elsewhere="tests/test_sweep_ray.py (--ray, --ray-address auto: a Ray of its own)",
    ),
    Mode(
        "leaderboard",
        "each workload at its own rate",
        ["leaderboard", "-q", "-w", "sharegpt@6", "-o", "{tmp}/rates"],
        refused=frozenset({"rate"}),
        elsewhere="the mode 'simulated' below",
    ),
    Mode(
        "leaderboard",
        "simulated",
        [
            "leaderboard",
            "-q",
            "-p",
            "fcfs",
            "-w",
            "sharegpt",
            "-n",
            "6",
            "--seeds",
            "1",
            "-j",
            "1",
            "-o",
            "{tmp}/board",
        ],
        refused=frozenset({"label", "model", "api_key", "timeout"}),
        switches=frozenset({"real"}),
        runs=[
            [
                "--metric",
                "ttft_mean_s",
                "--metric",
                "e2e_p99_s",
                "--rank-by",
                "e2e_p99_s",
                "--seed",
                "2",
                "--rate",
                "8",
                *PROFILE,
                "-p",
                "vtc",
                "--policy-opt",
                "vtc.input_weight=2",
                "--set",
                "max_num_seqs=8",
                "--baseline",
                "fcfs",
            ]
        ],
    ),
    Mode(
        "leaderboard",
        "with a served engine",
        [
            "leaderboard",
            "-q",
            "-p",
            "fcfs",
            "-w",
            "sharegpt",
            "--seeds",
            "1",
            "-j",
            "1",
            "--real",
            "{liar}",
            "-o",
            "{tmp}/board-real",
        ],
        runs=[
            [
                "--label",
                "served",
                "--model",
                LIAR_MODEL,
                "--api-key",
                "k",
                "--timeout",
                "30",
                "--metric",
                "ttft_mean_s",
                "--rank-by",
                "ttft_mean_s",
                "--seed",
                "2",
                "-n",
                "3",
                "--rate",
                "8",
                *PROFILE,
                "-p",
                "vtc",
                "--policy-opt",
                "vtc.input_weight=2",
                "--set",
                "max_num_seqs=8",
                "--baseline",
                "fcfs",
            ]
        ],
    ),
    Mode(
        "compare",
        "policies",
        ["compare", "-p", "fcfs", "-p", "vtc", "-n", "6", "--seeds", "2", "-q"],
        refused=frozenset({"replicas", "staleness"}),
        switches=frozenset({"router"}),
        runs=[
            [
                "--policy-opt",
                "vtc.input_weight=2",
                "--set",
                "max_num_seqs=8",
                "--workload",
                "synthetic",
                "--seed",
                "1",
                "--rate",
                "40",
                *PROFILE,
                "-o",
                "{tmp}/cmp",
                "--plot",
                "--baseline",
                "vtc",
            ],
            ["--trace", TRACE],
        ],
    ),
    Mode(
        "compare",
        "routers",
        ["compare", "--router", "round-robin", "--router", "power-of-two", "-n", "6", "--seeds", "1", "-q"],
        refused=frozenset({"policy_opt"}),
        runs=[
            [
                "--replicas",
                "2",
                "--staleness",
                "0.01",
                "-p",
                "fcfs",
                "--set",
                "max_num_seqs=8",
                "--workload",
                "synthetic",
                "--seed",
                "1",
                "--rate",
                "40",
                *PROFILE,
                "-o",
                "{tmp}/cmp-routers",
                "--plot",
                "--baseline",
                "power-of-two",
            ],
            ["--trace", TRACE],
        ],
    ),
    Mode(
        "compare",
        "result folders",
        ["compare", "{tmp}/alone", "{tmp}/sim", "-q"],
        refused=COMPARE_RUNS,
        runs=[["-o", "{tmp}/cmp-folders", "--plot", "--baseline", "sim"]],
    ),
    Mode(
        "bench",
        "a served engine",
        ["bench", "--url", "{liar}", "-q"],
        runs=[
            [
                "--workload",
                SPEC,
                "-n",
                "3",
                "--rate-scale",
                "2",
                "--seed",
                "1",
                "--model",
                LIAR_MODEL,
                "--label",
                "served",
                "-o",
                "{tmp}/bench",
                "--api-key",
                "k",
                "--timeout",
                "30",
            ],
            ["--trace", TRACE],
        ],
    ),
    Mode(
        "explain",
        "a run's folder",
        ["explain", "{tmp}/alone"],
        runs=[["--request", "req-0", "--full"], ["--step", "2"]],
    ),
    Mode(
        "explain",
        "a fleet's folder",
        ["explain", "{tmp}/fleet"],
        refused=frozenset({"step"}),
        refuses=[["--full", "-r", "req-0"]],
        runs=[["-r", "req-0"]],
    ),
    Mode(
        "check",
        "a policy",
        ["check", "-q", "-p", "vtc", "--examples", "1", "--steps", "2", "--starvation-examples", "1"],
        refused=frozenset({"router_opt"}),
        switches=frozenset({"router"}),
        runs=[["--policy-opt", "input_weight=2", "--shrink-seconds", "1"]],
    ),
    Mode(
        "check",
        "a router",
        ["check", "-q", "--router", "power-of-two", "--examples", "1"],
        refused=frozenset({"policy", "policy_opt", "steps", "starvation_examples", "shrink_seconds"}),
        runs=[["--router-opt", "seed=2"]],
    ),
    Mode(
        "capacity",
        "policies",
        ["capacity", "--slo", "ttft_p99=2", "-n", "6", "--seeds", "1", "--tolerance", "1", "-q"],
        refused=frozenset({"replicas", "staleness"}),
        switches=frozenset({"router"}),
        runs=[
            [
                "-p",
                "vtc",
                "--policy-opt",
                "vtc.input_weight=2",
                "-p",
                "fcfs",
                "--set",
                "max_num_seqs=8",
                "--workload",
                "synthetic",
                "--seed",
                "1",
                "--rate",
                "20",
                *PROFILE,
                "--baseline",
                "fcfs",
                "-o",
                "{tmp}/capacity",
                "--plot",
            ],
            ["-p", "fcfs", "--trace", TRACE],
        ],
    ),
    Mode(
        "capacity",
        "routers",
        [
            "capacity",
            "--slo",
            "ttft_p99=2",
            "-n",
            "6",
            "--seeds",
            "1",
            "--tolerance",
            "1",
            "-q",
            "--router",
            "round-robin",
            "--router",
            "power-of-two",
        ],
        refused=frozenset({"policy_opt"}),
        runs=[
            [
                "--replicas",
                "2",
                "--staleness",
                "0.01",
                "-p",
                "fcfs",
                "--set",
                "max_num_seqs=8",
                "--workload",
                "synthetic",
                "--seed",
                "1",
                "--rate",
                "20",
                *PROFILE,
                "--baseline",
                "round-robin",
                "-o",
                "{tmp}/capacity-routers",
                "--plot",
            ],
            ["--trace", TRACE],
        ],
    ),
    Mode(
        "calibrate",
        "real runs",
        ["calibrate", "--from", str(RUN), "-o", "{tmp}/gpu.json"],
        refused=STEP_FIT_OPTIONS,
        elsewhere="tests/test_validation.py (a fit takes about a minute)",
    ),
    Mode(
        "calibrate",
        "recorded steps",
        ["calibrate", "{tmp}/steps.csv"],
        refused=GPU_FIT_OPTIONS,
        switches=frozenset({"from_"}),
        runs=[
            [
                "--name",
                "fit",
                "-o",
                "{tmp}/fit.json",
                "--kv-bytes-per-token",
                "1000",
                "--swap-gb-per-s",
                "8",
                "--copy-gb-per-s",
                "50",
                "--description",
                "a test",
            ]
        ],
    ),
    Mode(
        "verify",
        "a model",
        ["verify", "--model", "tiny-gpt2", "--scenario", "mixed", "--num-prompts", "1", "--max-tokens", "2", "-q"],
        runs=[["--attention", "torch", "--threads", "1", "--device", "cpu"]],
    ),
    Mode("serve", "vLLM", ["serve"], elsewhere="tests/test_vllm_serve.py (each option on a real vLLM server)"),
    Mode(
        "validate",
        "result folders",
        ["validate", str(RUN), "--hardware", "h100-sxm", "--scale", "0.01", "-q"],
        runs=[["--model-config", "codellama-34b", "--seed", "1", "-o", "{tmp}/validate"]],
    ),
    Mode("policies", "a listing", ["policies"], runs=[[]]),
    Mode("routers", "a listing", ["routers"], runs=[[]]),
]

# How to give each option on its own where a mode refuses it (by parameter name; any valid value).
GIVE = {
    "policy": ["--policy", "fcfs"],
    "policy_opt": ["--policy-opt", "victim=lifo"],
    "set_": ["--set", "max_num_seqs=8"],
    "seed": ["--seed", "1"],
    "num_requests": ["-n", "3"],
    "rate": ["--rate", "5"],
    "output": ["-o", "{tmp}/refused"],
    "profile": PROFILE,
    "quiet": ["-q"],
    "workload": ["--workload", "synthetic"],
    "trace": ["--trace", TRACE],
    "rate_scale": ["--rate-scale", "2"],
    "start_offset": ["--start-offset", "1"],
    "arrival": ["--arrival", "gamma"],
    "cv": ["--cv", "2"],
    "slo_ttft": ["--slo-ttft", "1"],
    "slo_tpot": ["--slo-tpot", "1"],
    "plot": ["--plot"],
    "decision_log": ["--no-decision-log"],
    "trace_out": ["--trace-out", "{tmp}/t.json"],
    "executor": EXECUTOR_HF,
    "model": ["--model", "tiny-gpt2"],
    "prompt": ["--prompt", "Hi"],
    "max_tokens": ["--max-tokens", "2"],
    "temperature": ["--temperature", "1"],
    "replicas": ["--replicas", "2"],
    "router": ["--router", "round-robin"],
    "router_opt": ["--router-opt", "seed=1"],
    "staleness": ["--staleness", "0.1"],
    "prefill_replicas": ["--prefill-replicas", "1"],
    "decode_replicas": ["--decode-replicas", "1"],
    "fleet_spec": ["--fleet", "{tmp}/fleet.json"],
    "transfer_gbps": ["--transfer-gbps", "10"],
    "workers": ["-j", "2"],
    "label": ["--label", "x"],
    "api_key": ["--api-key", "k"],
    "timeout": ["--timeout", "5"],
    "seeds": ["--seeds", "2"],
    "step": ["--step", "1"],
    "debug": ["--debug"],
    "ray_timeout": ["--ray-timeout", "5"],
    "steps": ["--steps", "3"],
    "starvation_examples": ["--starvation-examples", "2"],
    "shrink_seconds": ["--shrink-seconds", "1"],
    "hardware": ["--hardware", "h100-sxm"],
    "model_config": ["--model-config", "llama-3.1-8b"],
    "tp": ["--tp", "2"],
    "dtype": ["--dtype", "fp8"],
    "gpu_memory_utilization": ["--gpu-memory-utilization", "0.8"],
    "rounds": ["--rounds", "1"],
    "scale": ["--scale", "0.5"],
    "kv_bytes_per_token": ["--kv-bytes-per-token", "1000"],
    "swap_gb_per_s": ["--swap-gb-per-s", "8"],
    "copy_gb_per_s": ["--copy-gb-per-s", "50"],
    "description": ["--description", "x"],
}


def _flags(command: str) -> dict[str, str]:
    """Each option's flag by parameter name (``--decision-log/--no-decision-log`` for a pair)."""
    return {p.name: "/".join([p.opts[0], *p.secondary_opts]) for p in COMMANDS[command].params}


def _given(command: str, args: list[str]) -> set[str]:
    """The parameters ``args`` give (options by their flags; a mode's arguments by position)."""
    names = {o: p.name for p in COMMANDS[command].params for o in [*p.opts, *p.secondary_opts]}
    arguments = {p.name for p in COMMANDS[command].params if p.param_type_name == "argument"}
    return {names[a] for a in args if a in names} | (arguments if command != "engine" and len(args) > 1 else set())


def test_every_option_of_every_mode_is_placed():
    """A new option must be placed in each mode of its command: read (a run gives it), refused, or a switch to
    another mode."""
    missing = []
    for mode in MODES:
        params = set(_flags(mode.command))
        run = {n for args in mode.runs for n in _given(mode.command, args)}
        both = sorted(run & mode.refused)
        assert not both, f"{mode.command} / {mode.name}: {both} both read and refused"
        if mode.elsewhere:
            continue
        refuses = {n for args in mode.refuses for n in _given(mode.command, args)}
        placed = _given(mode.command, mode.base) | run | mode.refused | mode.switches | refuses
        missing += [f"{mode.command} / {mode.name}: {_flags(mode.command)[name]}" for name in sorted(params - placed)]
    assert not missing, "options neither read by a run nor refused:\n" + "\n".join(missing)
    assert {m.command for m in MODES} == set(COMMANDS)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """What the modes read: a trace, a workload spec, a fleet spec, recorded steps, a fake served engine."""
    tmp = tmp_path_factory.mktemp("options")
    (tmp / "trace.csv").write_text(
        "arrival_time_s,prompt_tokens,output_tokens\n"
        + "".join(f"{0.02 * i:.2f},{40 + 7 * i},{4 + i % 5}\n" for i in range(12))
    )
    (tmp / "synthetic.json").write_text(
        json.dumps(
            {
                "kind": "synthetic",
                "num_requests": 4,
                "arrivals": {"kind": "poisson", "rate": 100},
                "prompt": {"kind": "fixed", "value": 8},
                "output": {"kind": "fixed", "value": 3},
            }
        )
    )
    (tmp / "fleet.json").write_text(json.dumps({"replicas": [{"count": 2, "policy": "fcfs"}]}))
    steps = "".join(f"{10 * i},{i % 3},{100 * i},0,0,{0.01 + 0.001 * i}\n" for i in range(1, 9))
    (tmp / "steps.csv").write_text(
        "prefill_tokens,decode_seqs,kv_tokens_read,blocks_swapped,blocks_copied,duration_s\n" + steps
    )
    for folder, options in (("alone", []), ("sim", []), ("fleet", ["--replicas", "2"])):  # read by explain, compare
        assert _invoke(["run", "-n", "6", "-q", "-o", str(tmp / folder), *options], {}).exit_code == 0
    Liar.counts, Liar.reasons, Liar.acts, Liar.context = (
        itertools.cycle([None]),
        itertools.cycle(["length"]),
        itertools.cycle(["answer"]),
        None,
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {"tmp": tmp, "liar": f"http://127.0.0.1:{server.server_address[1]}"}
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def no_debug(monkeypatch):
    """``--debug`` sets KVSCHED_DEBUG in this process: put it back after each test, for the tests after these."""
    monkeypatch.setenv("KVSCHED_DEBUG", "0")


def _invoke(args: list[str], files: dict):
    return CliRunner().invoke(app, [a.format(**files) for a in args])


def _with(mode: Mode, option: list[str]) -> list[str]:
    return [x for a in mode.base for x in (option if a == OPT else [a])] if OPT in mode.base else [*mode.base, *option]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m.command}: {m.name}")
def test_each_option_a_mode_does_not_read_is_refused_in_one_line(mode, files):
    names = {o: p.name for p in COMMANDS[mode.command].params for o in [*p.opts, *p.secondary_opts]}
    for option in [GIVE[name] for name in sorted(mode.refused)] + mode.refuses:
        result = _invoke(_with(mode, option), files)
        flag = _flags(mode.command)[names[option[0]]]
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, (mode.name, flag, result.output)
        assert any(f in lines[0] for f in flag.split("/")), (mode.name, flag, lines)
        assert "Traceback" not in result.output


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"{m.command}: {m.name}")
def test_the_options_a_mode_reads_run_together(mode, files):
    for run in mode.runs:
        result = _invoke(_with(mode, run), files)
        assert result.exit_code == 0, (mode.name, run, result.output)
