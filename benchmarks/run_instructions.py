"""Instructions a shortened like-Vidur ``Engine.run`` costs, counted by callgrind: a figure the machine's load does not
move (issue 33's speed check, ``sim_speed.py --one-like-vidur``, on its first ``-n`` requests).

Only the run is counted: it is called inside ``functools.reduce`` (which nothing in the loop calls), and callgrind
collects from that function's entry to its exit (``--toggle-collect``), so imports and the workload's build are left
out. A code is a commit (unpacked and its C extensions built, as ``commits_speed.py`` does) or a folder holding
``kvsched`` (put first on ``PYTHONPATH``), run in a fresh process with its string hashes fixed. Counts of one code
vary by about 0.25 % from run to run (dict layouts follow object addresses).

    .venv/bin/python benchmarks/run_instructions.py 0b64e72 main HEAD -n 300
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from commits_speed import code_folders  # noqa: E402


def inner(n: int) -> None:
    """The first ``n`` requests of the like-Vidur replay through ``Engine.run``, in this process."""
    import functools
    import gc

    import kvsched

    sys.path.insert(0, str(Path(kvsched.__file__).parent / "benchmarks"))  # that code's own settings
    import sim_speed

    from kvsched import Engine, EngineConfig, SimulatedExecutor
    from kvsched.workloads import build_workload

    requests = build_workload("azure-conv", max_total_tokens=sim_speed.VIDUR_MAX_TOKENS).requests()[:n]
    engine = Engine(EngineConfig(**sim_speed.LIKE_VIDUR), "vllm-default", SimulatedExecutor("llama2-7b-a100"))
    gc.collect()
    functools.reduce(lambda _, __: engine.run(requests), [0, 1])  # callgrind collects inside reduce only
    print(f"steps {engine.num_steps}", file=sys.stderr)


def instructions(folder: Path, n: int) -> tuple[int, int]:
    """What callgrind counts for ``inner(n)`` on the code in ``folder`` (the parent of its ``kvsched``), and steps."""
    env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONHASHSEED": "0"}
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "--collect-atstart=no"]
    command += ["--toggle-collect=functools_reduce", sys.executable, __file__, "--inner", str(n)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    found, steps = re.search(r"Collected : (\d+)", done.stderr), re.search(r"^steps (\d+)", done.stderr, re.M)
    if done.returncode or found is None or steps is None:
        raise SystemExit(f"{folder}: callgrind failed ({done.returncode}): {done.stderr[-1000:]}")
    return int(found.group(1)), int(steps.group(1))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--inner"]:
        inner(int(argv[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codes", nargs="+", help="commits or folders holding kvsched; the first is the baseline")
    parser.add_argument("-n", type=int, default=300, help="requests of the replay (19,366 in all)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvsched-run-instructions-") as tmp:
        folders = code_folders(args.codes, Path(tmp), build=True)
        print(f"| code ({args.n} requests) | steps | instructions of Engine.run | per step | ratio |")
        print("|---|---:|---:|---:|---:|")
        base = None
        for name, folder in folders.items():
            count, steps = instructions(folder, args.n)
            base = base or count
            print(f"| {name} | {steps:,} | {count:,} | {count / steps:,.0f} | {count / base:.3f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
