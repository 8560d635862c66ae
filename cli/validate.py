"""``engine validate DIR...``: simulate real runs recorded as inference-perf result folders and print the
error table; and ``engine calibrate --from DIR...``: refit a GPU's efficiencies to such runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from kvsched.cli.common import QuietOpt

FoldersArg = Annotated[
    list[Path],
    typer.Argument(
        help="inference-perf result folders: exp-config.yaml, results/config.yaml, results/*lifecycle_metrics.json"
    ),
]
HardwareOpt = Annotated[
    str,
    typer.Option(
        "--hardware", help="the GPU the runs used: h100-sxm, h200, a100-80gb, l40s, b200, or a hardware .json"
    ),
]
ModelConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--model-config", help="the model's config.json (default: the shipped config the run's model id names)"
    ),
]
ScaleOpt = Annotated[
    float,
    typer.Option(
        "--scale",
        min=1e-3,
        max=1.0,
        help="simulate each stage for this share of its duration (a quicker, rougher look)",
    ),
]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        help="folder for validation.csv, validation.json and each run's simulated inference-perf files",
    ),
]


def validate(
    folders: FoldersArg,
    hardware: HardwareOpt,
    model_config: ModelConfigOpt = None,
    seed: Annotated[int, typer.Option(help="seed of the simulated arrivals and counts")] = 0,
    scale: ScaleOpt = 1.0,
    output: OutputOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Simulate each recorded run with the settings it records; compare its stages' E2E, TTFT and ITL."""
    from kvsched.cli.common import console, err_console
    from kvsched.experiments.validation import mean_errors, read_experiment
    from kvsched.experiments.validation import validate as simulate
    from kvsched.reporting.destination import check_folder

    if output is not None:
        check_folder(output, ("validation.csv", "validation.json"))
    experiments = [read_experiment(f) for f in folders]  # every folder checked before the first simulation
    rows, runs = [], []
    for experiment in experiments:
        if not quiet:
            err_console.print(f"simulating {experiment.name} ...", highlight=False)
        v = simulate(experiment, hardware, model_config, seed=seed, scale=scale)
        rows += v.rows()
        runs.append({"experiment": experiment.name, "requests": v.num_requests, "simulate_s": round(v.simulate_s, 2)})
        console.print(validation_table(experiment.name, v.rows(), v.simulate_s, v.num_requests))
        if output is not None:
            from kvsched.reporting.files import write_lifecycle

            (Path(output) / experiment.name).mkdir(parents=True, exist_ok=True)
            write_lifecycle(v.simulated, Path(output) / experiment.name)
    errors = mean_errors(rows)
    console.print(
        "mean |error| over "
        + f"{len({(r['experiment'], r['stage']) for r in rows})} stages: "
        + "; ".join(
            f"{m.upper()} " + " / ".join(f"{100 * errors[f'{m}_{s}']:.1f}" for s in ("mean", "p90", "p99"))
            for m in ("e2e", "ttft", "itl")
        )
        + " % (mean / p90 / p99)",
        highlight=False,
    )
    times = ", ".join(f"{r['simulate_s']:.1f} s" for r in runs)
    console.print(f"time per experiment: {times}", highlight=False)
    if output is not None:
        _write(output, rows, {"errors": errors, "runs": runs, "hardware": hardware, "seed": seed, "scale": scale})


def validation_table(name: str, rows: list[dict], seconds: float, requests: int):
    from rich.table import Table

    table = Table(title=f"{name}: {requests:,} requests simulated in {seconds:.1f} s")
    for col in ("stage", "metric", "real mean / p90 / p99", "simulated", "error mean / p90 / p99"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["stage"]),
            r["metric"],
            " / ".join(f"{r[f'real_{s}']:.4g}" for s in ("mean", "p90", "p99")),
            " / ".join(f"{r[f'sim_{s}']:.4g}" for s in ("mean", "p90", "p99")),
            " / ".join(f"{100 * r[f'err_{s}']:+.1f}%" for s in ("mean", "p90", "p99")),
        )
    return table


def _write(output: Path, rows: list[dict], meta: dict) -> None:
    import csv

    from kvsched.reporting.destination import publishing_file

    output.mkdir(parents=True, exist_ok=True)
    with publishing_file(output / "validation.csv") as temp:
        with temp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    with publishing_file(output / "validation.json") as temp:
        temp.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")


def calibrate_from(folders: list[Path], hardware: str, output: Path, rounds: int, scale: float, seed: int = 0) -> None:
    """``engine calibrate --from``: fit ``hardware``'s efficiencies to the runs in ``folders``; write it with them."""
    from kvsched.cli.common import console
    from kvsched.executors.hardware import load_hardware
    from kvsched.experiments.gpu_fit import calibrate, in_overload
    from kvsched.experiments.validation import experiment_profile, read_experiment
    from kvsched.reporting.destination import check_file, publishing_file

    check_file(output, "--output")
    gpu = load_hardware(hardware)
    experiments = [read_experiment(f) for f in folders]
    usable = [x for x in experiments if not in_overload(x)]
    for x in experiments:
        if x not in usable:
            console.print(
                f"left out (in overload: most requests failed or queued for minutes): {x.name}", highlight=False
            )
    if not usable:
        raise ValueError("every run given is in overload: nothing to fit the step times to")
    start = time.perf_counter()
    fitted = calibrate(
        usable,
        lambda x, e: experiment_profile(x, gpu.model_copy(update={"efficiency": e})),
        gpu.efficiency,
        rounds=rounds,
        scale=scale,
        seed=seed,
        log=lambda line: console.print(line, highlight=False),
    )
    fitted = fitted.model_copy(update={"fitted_on": f"{len(usable)} runs: " + ", ".join(x.name for x in usable)})
    with publishing_file(output) as temp:
        temp.write_text(gpu.model_copy(update={"efficiency": fitted}).model_dump_json(indent=2) + "\n")
    console.print(
        f"fitted in {time.perf_counter() - start:.0f} s; wrote {output} (use it with --hardware {output})",
        highlight=False,
    )
