"""``engine calibrate``: fit a cost profile from a recorded run and write it as JSON for ``--profile``; or, with
``--from``, a GPU's roofline efficiencies to inference-perf result folders of real runs (``cli/validate.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# The options only one of calibrate's two fits reads (by parameter name); given to the other, refused.
STEP_FIT_OPTIONS = frozenset({"kv_bytes_per_token", "swap_gb_per_s", "copy_gb_per_s", "description"})
GPU_FIT_OPTIONS = frozenset({"hardware", "rounds", "scale"})


def calibrate(
    ctx: typer.Context,
    recorded: Annotated[
        Path | None,
        typer.Argument(
            help=(
                "CSV of measured steps (StepRecorder.save): prefill_tokens,decode_seqs,kv_tokens_read,"
                "blocks_swapped,blocks_copied,duration_s[,prefill_pairs]"
            )
        ),
    ] = None,
    name: Annotated[str, typer.Option(help="name of the fitted profile")] = "fitted",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="profile JSON to write (default NAME.json)")
    ] = None,
    kv_bytes_per_token: Annotated[int, typer.Option(help="KV bytes per token, all layers (for swap/copy time)")] = 0,
    swap_gb_per_s: Annotated[float, typer.Option(help="GPU<->CPU bandwidth for swap time")] = 16.0,
    copy_gb_per_s: Annotated[float, typer.Option(help="GPU<->GPU bandwidth for copy-on-write time")] = 100.0,
    description: Annotated[str, typer.Option(help="what was measured (model, hardware)")] = "",
    from_: Annotated[
        list[Path] | None,
        typer.Option("--from", help="instead: inference-perf result folders of real runs, to refit --hardware to"),
    ] = None,
    hardware: Annotated[
        str, typer.Option("--hardware", help="with --from: the GPU the runs used (a built-in name or a hardware .json)")
    ] = "h100-sxm",
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=10, help="with --from: simulate-and-fit rounds")] = 2,
    scale: Annotated[
        float,
        typer.Option(
            "--scale", min=1e-3, max=1.0, help="with --from: simulate each stage for this share of its duration"
        ),
    ] = 0.25,
) -> None:
    """Fit t = a + b·prefill_tokens + c·decode_seqs + d·kv_tokens_read + e·prefill_pairs to measured steps (or,
    with --from, a GPU's roofline efficiencies to real runs)."""
    from rich.table import Table

    from kvsched.cli.common import console, fail, refuse_unread

    if from_:
        from kvsched.cli.validate import calibrate_from

        if recorded is not None:
            fail("give either a CSV of measured steps or --from result folders, not both")
        refuse_unread(ctx, STEP_FIT_OPTIONS, "with --from: a GPU's efficiencies are fitted, not a linear profile")
        calibrate_from(from_, hardware, output or Path(f"{name}.json"), rounds, scale)
        return
    if recorded is None:
        fail("give a CSV of measured steps (StepRecorder.save), or --from inference-perf result folders")
    refuse_unread(ctx, GPU_FIT_OPTIONS, "to a CSV of measured steps: it refits a GPU to runs (give --from)")
    from kvsched.executors.calibration import fit_errors, fit_profile, load_records
    from kvsched.reporting.destination import check_apart, check_file, publishing_file

    path = output or Path(f"{name}.json")
    check_file(path, "--output")
    check_apart({"--output": (path, None)}, {"RECORDED": recorded})
    records = load_records(recorded)
    profile = fit_profile(
        records,
        name,
        description=description or f"fitted to {recorded.name}",
        kv_bytes_per_token=kv_bytes_per_token,
        swap_gb_per_s=swap_gb_per_s,
        copy_gb_per_s=copy_gb_per_s,
    )
    errors = fit_errors(profile, records)
    table = Table(title=f"profile {name}: {errors['n']} steps")
    table.add_column("term")
    table.add_column("ms", justify="right")
    for label, value in (
        ("a (per step)", profile.base_ms),
        ("b (per prefill token)", profile.prefill_token_ms),
        ("c (per decode sequence)", profile.decode_seq_ms),
        ("d (per KV token read)", profile.kv_token_ms),
        ("e (per prefill query-key pair)", profile.attention_pair_ms),
    ):
        table.add_row(label, f"{value:.6g}")
    console.print(table)
    console.print(
        f"relative error: mean {100 * errors['mape']:.2f}%, p95 {100 * errors['p95']:.2f}%, max "
        f"{100 * errors['max']:.2f}%"
    )
    with publishing_file(path) as temp:
        temp.write_text(profile.model_dump_json(indent=2) + "\n")
    console.print(f"wrote {path} (use it with --profile {path})", highlight=False)
