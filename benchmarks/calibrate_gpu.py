"""Fit the H100 roofline efficiencies to the BLIS team's real vLLM runs, and test them on models the fit never saw.

1. **All models**: fit ``Efficiency`` (``experiments/gpu_fit.py``) to every run not in overload, from
   the priors ``PRIORS`` (never from a fitted value): the values ``Efficiency`` ships as its defaults.
2. **Leave one model out**: for each of the four models, fit on the other three models' runs (same
   priors), then simulate all four runs of the held-out model, overloaded reasoning runs included,
   at full length, each timed: each stage's E2E, TTFT and ITL (inference-perf's
   ``normalized_time_per_output_token``) mean, p90 and p99 against what was measured.
3. **In sample**: every run simulated with the values ``Efficiency`` ships (the all-model fit, rounded to
   four digits): what ``engine validate --hardware h100-sxm`` prints.

Each fold's fitted GPU is written as a hardware JSON, so that ``engine validate DIR --hardware
FOLD.json`` prints a fold's rows again. Run (about an hour on the project's 2-core machine)::

    .venv/bin/python benchmarks/calibrate_gpu.py --out docs/figures/gpu-fidelity
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_args import bounded  # noqa: E402

from kvsched.executors.hardware import Efficiency, load_hardware  # noqa: E402
from kvsched.experiments.gpu_fit import FIELDS, PRIORS, calibrate, in_overload  # noqa: E402
from kvsched.experiments.validation import experiment_profile, mean_errors, read_experiment, validate  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "blis-h100"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder of inference-perf result folders")
    parser.add_argument("--hardware", default="h100-sxm")
    parser.add_argument("--rounds", type=bounded(int, 1, 10), default=2, help="simulate-and-fit rounds")
    parser.add_argument(
        "--scale", type=bounded(float, 0.01, 1.0), default=0.25, help="share of each stage simulated while fitting"
    )
    parser.add_argument(
        "--only",
        choices=("all", "lomo", "insample"),
        nargs="*",
        default=["all", "lomo", "insample"],
        help="the parts to run (none: rewrite the tables from the folder's fits.json and rows.json)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for fits.json, rows.json and each fold's hardware JSON"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = load_hardware(args.hardware)
    experiments = [read_experiment(d) for d in sorted(args.data.iterdir()) if (d / "exp-config.yaml").exists()]
    models = sorted({x.model for x in experiments})

    def fit(runs, label: str) -> Efficiency:
        usable = [x for x in runs if not in_overload(x)]
        print(f"fit {label}: {len(usable)} runs", flush=True)
        start = time.perf_counter()
        e = calibrate(
            usable,
            lambda x, eff: experiment_profile(x, gpu.model_copy(update={"efficiency": eff})),
            PRIORS,
            rounds=args.rounds,
            scale=args.scale,
            log=lambda line: print("  " + line, flush=True),
        )
        print(f"  {time.perf_counter() - start:.0f} s", flush=True)
        return e.model_copy(update={"fitted_on": f"{label}: " + ", ".join(x.name for x in usable)})

    def simulate(runs, e: Efficiency, label: str) -> list[dict]:
        rows = []
        hardware = gpu.model_copy(update={"efficiency": e})
        for x in runs:
            v = validate(x, hardware)
            print(f"  {label} {x.name}: {v.num_requests} requests in {v.simulate_s:.1f} s", flush=True)
            rows += [{**r, "fold": label, "simulate_s": v.simulate_s, "requests": v.num_requests} for r in v.rows()]
        return rows

    # Each part is saved as soon as it is done, and a part already in the folder is not run again
    # (delete fits.json and rows.json to start afresh): the whole takes about an hour.
    fits_path, rows_path = args.out / "fits.json", args.out / "rows.json"
    fits = json.loads(fits_path.read_text()) if fits_path.exists() else {}
    rows = json.loads(rows_path.read_text()) if rows_path.exists() else []

    def save() -> None:
        fits_path.write_text(json.dumps(fits, indent=2) + "\n")
        rows_path.write_text(json.dumps(rows, indent=2) + "\n")

    if "all" in args.only and "all" not in fits:
        fits["all"] = fit(experiments, "all models").model_dump()
        save()
    if "lomo" in args.only:
        for model in models:
            label = f"without {model}"
            if any(r["fold"] == label for r in rows):
                continue
            if label not in fits:
                fits[label] = fit([x for x in experiments if x.model != model], label).model_dump()
                save()
            e = Efficiency.model_validate(fits[label])
            (args.out / f"{args.hardware}-without-{model.split('/')[-1].lower()}.json").write_text(
                gpu.model_copy(update={"efficiency": e}).model_dump_json(indent=2) + "\n"
            )
            rows += simulate([x for x in experiments if x.model == model], e, label)
            save()
    if "insample" in args.only and not any(r["fold"] == "in sample" for r in rows):
        rows += simulate(experiments, Efficiency(), "in sample")  # what ships, which the docs' table shows
        save()
    tables = []
    for fold in ("lomo", "in sample"):
        chosen = [r for r in rows if (r["fold"] != "in sample") == (fold == "lomo")]
        if chosen:
            errors = mean_errors(chosen)
            print(f"{fold}: " + "; ".join(f"{k} {100 * v:.1f}%" for k, v in errors.items()), flush=True)
            tables.append(markdown(chosen, fold))
    (args.out / "tables.md").write_text("\n\n".join(tables) + "\n")
    print("fitted: " + ", ".join(f"{f} {fits['all'][f]:.4g}" for f in FIELDS) if "all" in fits else "", flush=True)
    return {"fits": fits, "rows": rows}


def markdown(rows: list[dict], fold: str) -> str:
    """A fold's rows as the docs' table: per experiment and stage, each metric's mean / p90 / p99 errors, its time."""
    lines = [
        f"<!-- {fold} -->",
        "| experiment | stage | E2E mean / p90 / p99 | TTFT mean / p90 / p99 | ITL mean / p90 / p99 "
        "| requests, simulated in |",
        "|---|---|---|---|---|---|",
    ]
    stages = sorted({(r["experiment"], r["stage"]) for r in rows})
    for name, stage in stages:
        cells = []
        for metric in ("e2e", "ttft", "itl"):
            r = next(x for x in rows if (x["experiment"], x["stage"], x["metric"]) == (name, stage, metric))
            cells.append(" / ".join(f"{100 * r[f'err_{s}']:+.1f}" for s in ("mean", "p90", "p99")))
        r = next(x for x in rows if (x["experiment"], x["stage"]) == (name, stage))
        lines.append(f"| {name[16:]} | {stage} | {' | '.join(cells)} | {r['requests']:,}, {r['simulate_s']:.1f} s |")
    errors = mean_errors(rows)
    stats = ("mean", "p90", "p99")
    means = [" / ".join(f"{100 * errors[f'{m}_{s}']:.1f}" for s in stats) for m in ("e2e", "ttft", "itl")]
    lines.append("| **mean \\|error\\|** | | " + " | ".join(means) + " | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
