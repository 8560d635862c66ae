"""Instructions one V1 step costs, counted by callgrind: a figure the machine's load does not move.

The case is ``scheduler_overhead.py``'s steady decode (``vllm-v1``, ``decode_lane=False``) at ``-n`` running
requests; the step is ``Scheduler.schedule()`` plus ``Completion.apply`` with one sampled token per request, made
alike on every code (the executor's token generation is left out, as ``scheduler_overhead.py`` leaves it out of its
times). Each code runs under ``valgrind --tool=callgrind`` twice, ``--short`` and ``--long`` steps after the same
warm-up, in a fresh process with its string hashes fixed: the difference over the extra steps is what a step costs,
start-up and warm-up cancelled. A code is a commit (unpacked by ``git archive``, as ``commits_speed.py`` does; no
compiled name index, so the pool's dict) or a folder holding ``kvsched`` (put first on ``PYTHONPATH``).

    .venv/bin/python benchmarks/step_instructions.py 58525b8 main HEAD -n 16 256
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


def inner(n: int, steps: int) -> None:
    """``steps`` steps after the warm-up, in this process (the code under test first on the import path)."""
    import kvsched

    sys.path.insert(0, str(Path(kvsched.__file__).parent / "benchmarks"))  # that code's own harness
    from scheduler_overhead import steady

    engine = steady(n, False, "vllm-v1")
    sched, clock, completion = engine.scheduler, engine.clock, engine.completion
    for _ in range(5):
        engine.step()
    for _ in range(steps):
        out = sched.schedule(clock.now())
        tokens = {sg.group.seqs[0].seq_id: [7] for sg in out.scheduled}  # not an EOS: every request decodes on
        clock.advance(0.01)
        completion.apply(out, tokens, clock.now())


def instructions(folder: Path, n: int, steps: int) -> int:
    """What callgrind counts for ``inner(n, steps)`` on the code in ``folder`` (the parent of its ``kvsched``)."""
    env = {**os.environ, "PYTHONPATH": str(folder), "PYTHONHASHSEED": "0"}
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__]
    done = subprocess.run(
        [*command, "--inner", str(n), str(steps)], env=env, capture_output=True, text=True, check=False
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or found is None:
        raise SystemExit(f"{folder}: callgrind failed ({done.returncode}): {done.stderr[-1000:]}")
    return int(found.group(1))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--inner"]:
        inner(int(argv[1]), int(argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("codes", nargs="+", help="commits or folders holding kvsched; the first is the baseline")
    parser.add_argument("-n", type=int, nargs="+", default=[16, 256], help="running requests")
    parser.add_argument("--short", type=int, default=20)
    parser.add_argument("--long", type=int, default=120)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvsched-instructions-") as tmp:
        folders = code_folders(args.codes, Path(tmp), build=False)
        print("| code | " + " | ".join(f"{n} running: instructions a step" for n in args.n) + " |")
        print("|---|" + "---:|" * len(args.n))
        base = None
        for name, folder in folders.items():
            costs = [
                (instructions(folder, n, args.long) - instructions(folder, n, args.short)) / (args.long - args.short)
                for n in args.n
            ]
            base = base or costs
            cells = [f"{c:,.0f} ({c / b:.3f})" for c, b in zip(costs, base)]
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
