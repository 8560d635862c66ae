"""How much of the ITL error is the client's token count, not the simulator: each stage of the H100 runs, its
*measured* latencies divided by counts drawn as ``engine validate`` draws them, against the measured ITL.

ITL (inference-perf's ``normalized_time_per_output_token``) is a request's latency over the output tokens the
client counted. The runs set ``ignore_eos``, so the latency does not depend on that count, and the simulation
pairs them independently. Here the measured latencies (drawn from the stage's recorded quantiles) take the
simulated ones' place, so every error printed is the counting's: with the counts interpolated from the report's
quantiles alone, and with the tail stretched to the report's mean of 1/count (``stretch_tail``). Run::

    .venv/bin/python benchmarks/itl_counting.py
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from kvsched.experiments.validation import counted_outputs, quantile_values, read_experiment

DATA = Path(__file__).resolve().parent / "data" / "blis-h100"
STATS = ("mean", "p90", "p99")


def stage_errors(latencies: np.ndarray, counts: np.ndarray, measured: dict) -> list[float]:
    """ITL mean, p90 and p99 of ``latencies`` over ``counts`` (0 for no tokens), relative to ``measured``."""
    itl = np.divide(latencies, counts, out=np.zeros(len(counts)), where=counts > 0)
    values = (np.mean(itl), np.percentile(itl, 90), np.percentile(itl, 99))
    return [v / measured[s] - 1 for v, s in zip(values, STATS)]


def main(argv: list[str] | None = None) -> dict[str, np.ndarray]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="folder of inference-perf result folders")
    args = parser.parse_args(argv)
    errors: dict[str, list] = {"interpolated": [], "stretched": []}
    print("| experiment | stage | interpolated: ITL mean / p90 / p99 | stretched: ITL mean / p90 / p99 |")
    print("|---|---|---|---|")
    for folder in sorted(d for d in args.data.iterdir() if (d / "exp-config.yaml").exists()):
        x = read_experiment(folder)
        for name in x.stages:
            successes = x.recorded[name]["successes"]
            stage, n = int(name.split("_")[1]), successes["count"]
            log = [SimpleNamespace(outcome="ok", stage=stage, request_id=f"r{i}") for i in range(n)]
            stretched = np.array(list(counted_outputs(x, log).values()), dtype=float)
            # the same draw before the stretch: counted_outputs's seeded order, its quantiles interpolated
            u = (np.random.default_rng(0).permutation(n) + 0.5) / n
            interpolated = np.rint(quantile_values(successes["output_len"], u))
            latencies = quantile_values(
                successes["latency"]["request_latency"], (np.random.default_rng(1).permutation(n) + 0.5) / n
            )
            measured = successes["latency"]["normalized_time_per_output_token"]
            cells = []
            for kind, counts in (("interpolated", interpolated), ("stretched", stretched)):
                errors[kind].append(stage_errors(latencies, counts, measured))
                cells.append(" / ".join(f"{100 * e:+.1f}" for e in errors[kind][-1]))
            print(f"| {x.name[16:]} | {stage} | {cells[0]} | {cells[1]} |")
    means = {k: np.mean(np.abs(v), axis=0) for k, v in errors.items()}
    print("mean |error|: " + "; ".join(f"{k} " + " / ".join(f"{100 * e:.1f}" for e in v) for k, v in means.items()))
    return means


if __name__ == "__main__":
    main()
