"""The ``engine`` command: run a policy on the embedded default workload, list and inspect policies."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvsched.core.errors import KvschedError
from kvsched.core import sim_cli as sim
from kvsched.core import hf_cli as hf
from kvsched.core import policy_cli

app = typer.Typer(
    name="engine",
    help="kvsched: vLLM-style scheduling with pluggable policies, simulated or on a real model.",
    invoke_without_command=True,
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

PolicyOpt = Annotated[str, typer.Option("--policy", "-p", help="policy name (see `engine policies`)")]
PolicyOptions = Annotated[Optional[list[str]], typer.Option("--policy-opt", help="policy constructor option KEY=VALUE (repeatable)")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="engine config override KEY=VALUE (repeatable), e.g. delay_factor=0.5")]
SeedOpt = Annotated[int, typer.Option(help="workload seed")]
NumOpt = Annotated[Optional[int], typer.Option("--num-requests", "-n", help="requests in the synthetic workload")]
RateOpt = Annotated[Optional[float], typer.Option(help="mean arrival rate, requests/s")]
OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="results folder: summary.json, requests.csv/.parquet, timeseries.parquet")]
ProfileOpt = Annotated[str, typer.Option(help="simulator cost profile")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")]


def fail(message: str, code: int = 2) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def cli_errors(fn):
    """Turn expected errors into one clear line and exit status 2 (never a traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or exc.title
            fail(f"invalid {exc.title}: {field}: {first['msg']}" + (f" (got {first['input']!r})" if "input" in first and not isinstance(first["input"], dict) else ""))
        except KvschedError as exc:
            fail(str(exc))
        except (KeyError, ValueError, FileNotFoundError) as exc:
            fail(str(exc.args[0]) if exc.args else repr(exc))

    return wrapper


def parse_pairs(pairs: list[str] | None, what: str) -> dict[str, Any]:
    """``KEY=VALUE`` strings to a dict; values stay strings for pydantic to validate and coerce."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} expects KEY=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out


def build_config(overrides: list[str] | None):
    from kvsched.core.config import EngineConfig

    return EngineConfig.model_validate(parse_pairs(overrides, "--set"))


def progress_bar(quiet: bool) -> Progress:
    return Progress(
        TextColumn("[bold]simulating"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
        TimeElapsedColumn(), console=err_console, disable=quiet,
    )


def summary_table(summary: dict) -> Table:
    table = Table(title=f"policy {summary['policy']} · profile {summary.get('profile', '?')}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("requests (finished / ignored / aborted)", f"{summary['finished']} / {summary['ignored']} / {summary['aborted']}")
    table.add_row("simulated duration", f"{summary['duration_s']:.1f} s")
    table.add_row("throughput", f"{summary['requests_per_s']:.2f} req/s · {summary['throughput_tokens_per_s']:.0f} tok/s")
    for key, label, scale, unit in (("ttft_s", "TTFT", 1, "s"), ("tpot_s", "TPOT", 1000, "ms"), ("e2e_s", "end-to-end", 1, "s")):
        d = summary[key]
        if d["mean"] is None:
            table.add_row(label, "-")
        else:
            table.add_row(f"{label} mean / p50 / p99", " / ".join(f"{d[k] * scale:.3g}" for k in ("mean", "p50", "p99")) + f" {unit}")
    p = summary["preemptions"]
    table.add_row("preemptions (recompute / swap)", f"{p['recompute']} / {p['swap']}")
    table.add_row("blocks swapped (in / out)", f"{summary['blocks_swapped_in']} / {summary['blocks_swapped_out']}")
    table.add_row("leaked blocks", str(summary["leaked_blocks"]))
    return table


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
) -> None:
    """Without a sub-command: run POLICY on the embedded default workload (simulated), as `engine run` does."""
    if ctx.invoked_subcommand is None:
        sim.run_command(policy, policy_opt, set_, seed, num_requests, rate, output, profile, quiet)


@app.command()
@cli_errors
def run(
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
    executor: hf.ExecutorOpt = "sim",
    model: hf.ModelOpt = "smollm2-135m",
    prompt: hf.PromptOpt = None,
    max_tokens: hf.MaxTokensOpt = 64,
    temperature: hf.TemperatureOpt = 0.0,
) -> None:
    """Run a policy on a workload with every option (simulated executor, or a real model with --executor hf)."""
    if executor != "sim":
        if executor != "hf":
            fail(f"unknown executor {executor!r}: use sim or hf")
        hf.run_command(policy, policy_opt, set_, seed, num_requests, rate, output, quiet, model, prompt, max_tokens, temperature)
        return
    sim.run_command(policy, policy_opt, set_, seed, num_requests, rate, output, profile, quiet,
                    workload, trace, rate_scale, start_offset, arrival, cv, slo_ttft, slo_tpot, plot)


@app.command()
@cli_errors
def policies() -> None:
    """List installed policies: name, distribution, version, description."""
    from kvsched.core.plugins import available_policies, describe, load_policy

    table = Table(title="installed policies (entry-point group kvsched.policies)")
    for col in ("name", "distribution", "version", "description"):
        table.add_column(col, overflow="fold")
    for info in available_policies().values():
        try:
            text = describe(load_policy(info.name))
        except Exception as exc:  # a broken third-party plugin must not hide the others
            text = f"(fails to load: {type(exc).__name__}: {exc})"
        table.add_row(info.name, info.distribution, info.version, text)
    console.print(table)


sim.register(app)  # engine sweep, engine calibrate (kvsched.core.sim_cli)
hf.register(app)  # engine verify (kvsched.core.hf_cli)
policy_cli.register(app)  # engine check, engine compare (kvsched.core.policy_cli)


def main() -> None:
    app()
