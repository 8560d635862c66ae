"""The ``engine`` command: run a policy on the embedded default workload, list and inspect policies."""

from __future__ import annotations

import os
import sys

import typer

from kvsched.cli import cluster as fleet
from kvsched.cli import explain as explain_cli
from kvsched.cli import policies as policy_cli
from kvsched.cli import real as hf
from kvsched.cli import routers as router_cli
from kvsched.cli import simulate as sim
from kvsched.cli.bench import bench
from kvsched.cli.capacity import capacity
from kvsched.cli.common import (
    DebugOpt,
    NumOpt,
    OutputOpt,
    PolicyOpt,
    PolicyOptions,
    ProfileOpt,
    QuietOpt,
    RateOpt,
    SeedOpt,
    SetOpt,
    cli_errors,
    error_line,
    fail,
    input_files,
    refuse_unread,
)
from kvsched.cli.leaderboard import leaderboard
from kvsched.cli.serve import serve

app = typer.Typer(
    name="engine",
    help="kvsched: vLLM-style scheduling with pluggable policies, simulated or on a real model.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
@cli_errors
def main_callback(
    ctx: typer.Context,
    policy: PolicyOpt = "vllm-default",
    policy_opt: PolicyOptions = None,
    set_: SetOpt = None,
    seed: SeedOpt = 0,
    num_requests: NumOpt = None,
    rate: RateOpt = None,
    output: OutputOpt = None,
    profile: ProfileOpt = "llama2-7b-a100",
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Without a sub-command: run POLICY on the embedded default workload (simulated), as `engine run` does."""
    if debug:
        os.environ["KVSCHED_DEBUG"] = "1"
    if ctx.invoked_subcommand is not None:  # they run `engine` alone: before a command, they would be ignored
        refuse_unread(
            ctx,
            {p.name for p in ctx.command.params} - {"debug"},
            f"before the command: give it after it (engine {ctx.invoked_subcommand} ...)",
        )
    else:
        sim.run_command(policy, policy_opt, set_, seed, num_requests, rate, output, profile, quiet)


@app.command()
@cli_errors
def run(
    ctx: typer.Context,
    policy: PolicyOpt = "vllm-default",
    policy_opt: PolicyOptions = None,
    set_: SetOpt = None,
    seed: SeedOpt = 0,
    num_requests: NumOpt = None,
    rate: RateOpt = None,
    output: OutputOpt = None,
    profile: ProfileOpt = "llama2-7b-a100",
    quiet: QuietOpt = False,
    workload: sim.WorkloadOpt = None,
    trace: sim.TraceOpt = None,
    rate_scale: sim.RateScaleOpt = 1.0,
    start_offset: sim.StartOffsetOpt = 0.0,
    arrival: sim.ArrivalOpt = None,
    cv: sim.CvOpt = 1.0,
    slo_ttft: sim.SloTtftOpt = None,
    slo_tpot: sim.SloTpotOpt = None,
    plot: sim.PlotOpt = False,
    decision_log: sim.DecisionLogOpt = True,
    trace_out: sim.TraceOutOpt = None,
    executor: hf.ExecutorOpt = "sim",
    model: hf.ModelOpt = hf.DEFAULT_MODEL,
    prompt: hf.PromptOpt = None,
    max_tokens: hf.MaxTokensOpt = 64,
    temperature: hf.TemperatureOpt = 0.0,
    replicas: fleet.ReplicasOpt = None,
    router: fleet.RouterOpt = None,
    router_opt: fleet.RouterOptOpt = None,
    staleness: fleet.StalenessOpt = None,
    prefill_replicas: fleet.PrefillOpt = None,
    decode_replicas: fleet.DecodeOpt = None,
    fleet_spec: fleet.FleetOpt = None,
    transfer_gbps: fleet.BandwidthOpt = None,
    hardware: sim.HardwareOpt = None,
    model_config: sim.ModelConfigOpt = None,
    tp: sim.TpOpt = 1,
    dtype: sim.DtypeOpt = None,
    gpu_memory_utilization: sim.GpuMemoryOpt = 0.9,
) -> None:
    """Run a policy on a workload with every option (simulated executor, or a real model with --executor hf; a fleet
    with --replicas)."""
    if executor not in ("sim", "hf"):
        fail(f"unknown executor {executor!r}: use sim or hf")
    if fleet.wanted(replicas, prefill_replicas, decode_replicas, fleet_spec):
        from kvsched.workloads import build_workload

        if executor != "sim":
            fail("--executor hf runs one real engine; a fleet is simulated (drop --executor, or the fleet's options)")
        refuse_unread(ctx, HF_OPTIONS, "to a fleet: it is simulated (--executor hf runs one real engine)")
        refuse_unread(ctx, GPU_OPTIONS, "to a fleet: its replicas take --profile (a GPU's roofline models one engine)")
        refuse_unread(
            ctx,
            ONE_ENGINE_OUTPUTS,
            "to a fleet: its results (summary.json, requests.csv, routes.csv, "
            "report.html) have no SLO goodput, decision log or Chrome trace yet",
        )
        if fleet_spec is not None:
            refuse_unread(
                ctx,
                FLEET_SPEC_FIELDS,
                "with --fleet: the spec's replica groups give each replica's policy, options, settings and profile",
            )
        spec = fleet.fleet_spec(
            policy,
            policy_opt,
            set_,
            profile,
            replicas,
            router,
            router_opt,
            staleness,
            prefill_replicas,
            decode_replicas,
            fleet_spec,
            transfer_gbps,
        )
        built = build_workload(
            workload,
            trace,
            num_requests=num_requests,
            rate=rate,
            rate_scale=rate_scale,
            start_offset=start_offset,
            arrival=arrival,
            cv=cv,
            seed=seed,
        )
        inputs = {**input_files(workload, trace, profile, [policy], built), "--fleet": fleet_spec}
        fleet.run_command(spec, built, output, quiet, inputs, plot=plot)
        return
    refuse_unread(
        ctx,
        FLEET_OPTIONS,
        "to one engine: it routes or shapes a fleet (give --replicas N, "
        "--prefill-replicas with --decode-replicas, or --fleet)",
    )
    if executor == "hf":
        refuse_unread(
            ctx,
            SIM_OPTIONS,
            "to a real model (--executor hf): it runs --prompt (or its built-in prompts), not a simulated workload",
        )
        if prompt:
            refuse_unread(ctx, {"num_requests"}, "with --prompt: the prompts given are the requests")
        hf.run_command(
            policy, policy_opt, set_, seed, num_requests, rate, output, quiet, model, prompt, max_tokens, temperature
        )
        return
    refuse_unread(ctx, HF_OPTIONS, "to a simulation: it is for a real model (give --executor hf)")
    gpu = None
    if hardware is None and model_config is None:
        refuse_unread(ctx, GPU_OPTIONS, "without --hardware and --model-config: it describes a GPU")
    else:
        refuse_unread(ctx, {"profile"}, "with --hardware and --model-config: they derive the cost model")
        gpu = {
            "hardware": hardware,
            "model_config": model_config,
            "tp": tp,
            "dtype": dtype,
            "gpu_memory_utilization": gpu_memory_utilization,
        }
    sim.run_command(
        policy,
        policy_opt,
        set_,
        seed,
        num_requests,
        rate,
        output,
        profile,
        quiet,
        workload,
        trace,
        rate_scale,
        start_offset,
        arrival,
        cv,
        slo_ttft,
        slo_tpot,
        plot,
        decision_log,
        trace_out,
        gpu,
    )


# The options of `engine run` that only some of its modes read, by parameter name: given where they are not read,
# they are refused (one line, exit 2) rather than taken and ignored. tests/test_cli_options.py enumerates them all.
HF_OPTIONS = frozenset({"model", "prompt", "max_tokens", "temperature"})
GPU_OPTIONS = frozenset({"hardware", "model_config", "tp", "dtype", "gpu_memory_utilization"})  # a roofline's
SIM_OPTIONS = (
    frozenset(
        {
            "profile",
            "workload",
            "trace",
            "rate_scale",
            "start_offset",
            "arrival",
            "cv",
            "slo_ttft",
            "slo_tpot",
            "plot",
            "decision_log",
            "trace_out",
        }
    )
    | GPU_OPTIONS
)
FLEET_OPTIONS = frozenset(
    {
        "replicas",
        "router",
        "router_opt",
        "staleness",
        "prefill_replicas",
        "decode_replicas",
        "fleet_spec",
        "transfer_gbps",
    }
)
ONE_ENGINE_OUTPUTS = frozenset({"slo_ttft", "slo_tpot", "decision_log", "trace_out"})  # none in a fleet's yet
FLEET_SPEC_FIELDS = frozenset({"policy", "policy_opt", "set_", "profile"})


@app.command()
@cli_errors
def policies() -> None:
    """List installed policies: name, distribution, version, description (a name that several distributions register,
    as DIST:NAME); and which prefix-cache index the pools use."""
    from kvsched.allocators.block_pool import index_in_use
    from kvsched.cli.common import print_plugins
    from kvsched.plugins.discovery import installed_policies, load_policy
    from kvsched.plugins.identity import describe

    print_plugins("policy", installed_policies(), lambda spec: describe(load_policy(spec)))
    print(f"prefix-cache index: {index_in_use()}")


sim.register(app)  # engine sweep, engine calibrate (kvsched.cli.simulate)
app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(cli_errors(serve))
app.command()(cli_errors(bench))
hf.register(app)  # engine verify (kvsched.cli.real)
policy_cli.register(app)  # engine check, engine compare (kvsched.cli.policies)
explain_cli.register(app)  # engine explain (kvsched.cli.explain)
router_cli.register(app)  # engine routers (kvsched.cli.routers)
app.command()(cli_errors(leaderboard))
app.command()(cli_errors(capacity))


def main() -> None:
    """The console script: ``--debug`` may come anywhere on the line, and a usage error (an unknown
    option, a value of the wrong type) is one line, as every other bad input."""
    args = sys.argv[1:]
    if "--debug" in args[: args.index("--") if "--" in args else len(args)]:
        args.remove("--debug")
        args.insert(0, "--debug")
    try:
        code = app(args, standalone_mode=False, prog_name="engine")
    except typer.Abort:
        code = 1
    except typer.TyperException as exc:  # click's UsageError and BadParameter
        where = f"{exc.ctx.command_path}: " if getattr(exc, "ctx", None) else ""
        error_line(f"{where}{exc.format_message()} (see --help)")
        code = 2
    sys.exit(code or 0)
