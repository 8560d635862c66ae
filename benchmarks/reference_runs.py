"""Reference runs whose results must not change when the engine is only refactored or sped up.

The v0 policies, the Azure trace at twice its rate, prefix caching, KV pressure, forced swap and
forced recompute; V1's mechanics (``vllm-v1``, a policy ordering its own queue, speculative decoding),
async scheduling on both, and fleets (routed at arrival and routed ahead): each through the ``engine``
console script with its engine settings given explicitly (so that a change of defaults does not count
as a change of behaviour). The default workload has requests with ``n > 1``.

    .venv/bin/python benchmarks/reference_runs.py --save /tmp/ref-before     # on the old commit
    .venv/bin/python benchmarks/reference_runs.py --check /tmp/ref-before    # on the new one

``--check`` prints, per run, whether ``summary.json`` and ``requests.csv`` are byte-identical, and the rest of the
folder the same where the saved reference holds it (a fleet's ``routes.csv``, byte for byte; a single run's time
series and decision log, ``timeseries.parquet`` and ``decisions.parquet``, as tables: the files' metadata name the
writer's version), and exits 1 if any is not. ``--ignore-key`` leaves a top-level summary key out of the comparison
(for a change that adds a key on purpose, such as a new config field).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ENGINE = Path(sys.executable).with_name("engine")
PINNED = {"num_gpu_blocks": "2048", "max_num_batched_tokens": "2048", "max_model_len": "2048", "num_cpu_blocks": "1024"}
PROFILE = ["--profile", "llama2-7b-a100"]
TENANTS = str(Path(__file__).resolve().parents[1] / "docs" / "examples" / "bursty-tenants.json")

RUNS: dict[str, list[str]] = {
    "vllm-default": ["--policy", "vllm-default"],
    "fcfs": ["--policy", "fcfs"],
    "sarathi": ["--policy", "sarathi", "--set", "max_num_batched_tokens=512"],
    "sjf": ["--policy", "sjf", "--policy-opt", "predictor=noisy"],
    "vtc": ["--policy", "vtc", "--workload", TENANTS, "-n", "1500"],
    "lpm": ["--policy", "lpm", "--set", "enable_prefix_caching=true"],
    "priority-vip": ["--policy", "priority-vip", "--workload", TENANTS, "-n", "1500"],
    "azure-x2": ["--policy", "vllm-default", "--workload", "azure-conv", "--rate-scale", "2"],
    "prefix-caching": [
        "--policy",
        "vllm-default",
        "--set",
        "enable_prefix_caching=true",
        "--workload",
        "sharegpt",
        "-n",
        "1000",
    ],
    "kv-pressure": ["--policy", "vllm-default", "--set", "num_gpu_blocks=300", "--set", "delay_factor=0.5"],
    "forced-swap": ["--policy", "fcfs", "--set", "num_gpu_blocks=400", "--set", "preemption_mode=swap"],
    "forced-recompute": [
        "--policy",
        "sarathi",
        "--set",
        "num_gpu_blocks=400",
        "--set",
        "preemption_mode=recompute",
        "--workload",
        "azure-conv",
        "-n",
        "3000",
    ],
    "vllm-v1": ["--policy", "vllm-v1", "--set", "enable_prefix_caching=true", "--set", "num_gpu_blocks=300"],
    "lcf-speculative": ["--policy", "lcf", "--set", "num_gpu_blocks=400", "--set", "num_speculative_tokens=2"],
    "async-v1": [
        "--policy",
        "vllm-v1",
        "-n",
        "400",
        "--rate",
        "30",
        "--set",
        "num_gpu_blocks=128",
        "--set",
        "block_size=8",
        "--set",
        "enable_prefix_caching=true",
        "--set",
        "async_scheduling=true",
    ],
    "async-v0": ["--policy", "vllm-default", "--set", "num_gpu_blocks=300", "--set", "async_scheduling=true"],
    "fleet": [
        "--policy",
        "vllm-v1",
        "--replicas",
        "3",
        "--router",
        "prefix-affinity",
        "--set",
        "num_gpu_blocks=400",
        "--set",
        "enable_prefix_caching=true",
        "--workload",
        "sharegpt",
        "-n",
        "1000",
    ],
    "fleet-ahead": [
        "--policy",
        "vllm-default",
        "--replicas",
        "4",
        "--router",
        "vllm-dp",
        "--staleness",
        "0.05",
        "--workload",
        "azure-conv",
        "--rate-scale",
        "4",
        "-n",
        "4000",
    ],
}
FILES = ("summary.json", "requests.csv")  # compared always
MORE = ("routes.csv", "timeseries.parquet", "decisions.parquet")  # compared where the saved reference has them


def command(args: list[str]) -> list[str]:
    """The run's arguments with the pinned settings: a run's own ``--set`` replaces a pinned one (a setting is given
    once: the CLI refuses it twice)."""
    settings, rest, words = dict(PINNED), [], iter(args)
    for word in words:
        if word == "--set":
            key, _, value = next(words).partition("=")
            settings[key] = value
        else:
            rest.append(word)
    return [word for key, value in settings.items() for word in ("--set", f"{key}={value}")] + PROFILE + rest


def run_all(dest: Path) -> None:
    for name, args in RUNS.items():
        out = dest / name
        cmd = [str(ENGINE), "run", "-q", *command(args), "--output", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{name}: {' '.join(cmd)} failed:\n{done.stderr}")
        for extra in out.iterdir():  # keep only what is compared
            if extra.name not in FILES + MORE:
                extra.unlink() if extra.is_file() else shutil.rmtree(extra)
        print(f"{name}: done", flush=True)


def compare(base: Path, new: Path, ignore: set[str]) -> bool:
    same_all = True
    for name in RUNS:
        notes = []
        old_summary = json.loads((base / name / "summary.json").read_text())
        new_summary = json.loads((new / name / "summary.json").read_text())
        keys = (old_summary.keys() | new_summary.keys()) - ignore
        differing = sorted(k for k in keys if old_summary.get(k) != new_summary.get(k))
        if differing:
            notes.append(f"summary.json differs in {', '.join(differing)}")
        elif not ignore and (base / name / "summary.json").read_bytes() != (new / name / "summary.json").read_bytes():
            notes.append("summary.json differs in formatting")
        if (base / name / "requests.csv").read_bytes() != (new / name / "requests.csv").read_bytes():
            notes.append("requests.csv differs")
        notes += [
            f"{f} differs" for f in MORE if (base / name / f).exists() and not same(base / name / f, new / name / f)
        ]
        same_all &= not notes
        print(f"{name:18s} {'identical' if not notes else '; '.join(notes)}")
    return same_all


def same(old: Path, fresh: Path) -> bool:
    """Whether ``fresh`` holds what ``old`` does: a CSV byte for byte, a Parquet file's table (its schema and rows)."""
    if not fresh.exists():
        return False
    if old.suffix != ".parquet":
        return old.read_bytes() == fresh.read_bytes()
    import pyarrow.parquet as pq

    return pq.read_table(old).equals(pq.read_table(fresh))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--save", type=Path, help="run all and keep the results in this folder")
    what.add_argument("--check", type=Path, help="run all and compare with a folder written by --save")
    parser.add_argument("--ignore-key", action="append", default=[], help="top-level summary key to leave out")
    args = parser.parse_args()
    if args.save is not None:
        if args.save.exists():
            sys.exit(f"{args.save} exists; pick a new folder")
        run_all(args.save)
        return
    with tempfile.TemporaryDirectory() as tmp:
        run_all(Path(tmp))
        sys.exit(0 if compare(args.check, Path(tmp), set(args.ignore_key)) else 1)


if __name__ == "__main__":
    main()
