"""One benchmark on several commits, alternating round by round in one run: on a shared machine only ratios
measured side by side mean anything.

Each commit is unpacked with ``git archive`` into a temporary folder named ``kvsched`` and every round runs the
benchmark once per commit, each in its own process with that folder's parent first on the import path (entry
points come from the installed metadata; they name modules, which resolve to the commit's). The benchmark prints
a JSON object on its last line, of which ``--key`` is read. Prints each commit's median and fastest round and
their ratios against the first commit's, and the median of its rounds' own ratios to the first commit's in the same
round (paired: a round's load and the machine's state weigh on both sides alike, where the medians of each side
may fall in different rounds).

A commit whose ``pyproject.toml`` declares C extensions (``[[tool.setuptools.ext-modules]]``, as ``make setup``
builds them) has them built in its folder first, so each commit runs as it ships; ``--pure`` leaves them unbuilt
(the Python fallbacks), which compares the Python code alone.

    .venv/bin/python benchmarks/commits_speed.py 58525b8 a0c3fc7 HEAD --rounds 9 --key loop_cpu_s \\
        -- benchmarks/sim_speed.py --one-like-vidur --policy vllm-default
    .venv/bin/python benchmarks/commits_speed.py a0c3fc7 HEAD --rounds 7 --key cpu_us_per_request \\
        -- benchmarks/cluster_speed.py --replicas 16 -n 30000
    .venv/bin/python benchmarks/commits_speed.py d7e2f69 HEAD --script-here --rounds 5 --key loop_cpu_s \\
        -- benchmarks/sim_speed.py --one-like-vidur --fleet-of-one   # this script, each commit's package
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def unpack(commit: str, into: Path) -> tuple[str, Path]:
    """``commit``'s tree as ``into/<sha>/kvsched``; its short sha and that folder."""
    sha = subprocess.run(
        ["git", "rev-parse", "--short=7", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if sha.returncode:
        raise SystemExit(f"not a commit of this repository: {commit!r}")
    short = sha.stdout.strip()
    folder = into / short / "kvsched"
    folder.mkdir(parents=True)
    tree = subprocess.run(["git", "archive", "--format=tar", short], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tree)) as archive:
        archive.extractall(folder, filter="data")
    return short, folder


def build_extensions(short: str, folder: Path) -> bool:
    """Build ``folder``'s C extensions in place, as ``make compiled`` does; False if the commit declares none."""
    pyproject = folder / "pyproject.toml"
    if not pyproject.is_file() or "[[tool.setuptools.ext-modules]]" not in pyproject.read_text():
        return False
    build = [sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_ext", "--inplace"]
    done = subprocess.run(build, cwd=folder, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{short}: building its C extensions failed: {done.stderr[-500:]}")
    return True


def code_folders(codes: list[str], into: Path, build: bool) -> dict[str, Path]:
    """Each code by its label: a folder holding ``kvsched`` as given, or a commit unpacked under ``into`` (its C
    extensions built if ``build``); the folder to put first on ``PYTHONPATH``."""
    folders = {}
    for code in codes:
        if (Path(code) / "kvsched").is_dir():
            folders[code] = Path(code)
        else:
            short, folder = unpack(code, into)
            if build:
                build_extensions(short, folder)
            folders[f"{code} ({short})" if code != short else code] = folder.parent
    return folders


def one_round(folder: Path, command: list[str], key: str, script_here: bool = False) -> float:
    """The benchmark run once on the code in ``folder`` (its own script, or this checkout's if ``script_here``): the
    ``key`` of the JSON object on its last line."""
    env = {**os.environ, "PYTHONPATH": str(folder.parent)}
    cwd = ROOT if script_here else folder
    done = subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{folder.parent.name}: {' '.join(command)} exited {done.returncode}: {done.stderr[-500:]}")
    last = json.loads(done.stdout.strip().splitlines()[-1])
    if key not in last:
        raise SystemExit(f"the benchmark's last line has no {key!r}: it has {', '.join(last)}")
    return float(last[key])


def main(argv: list[str]) -> None:
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commits", nargs="+", help="the first is the baseline")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--key", required=True, help="the cost read from the benchmark's last JSON line (lower is faster)"
    )
    parser.add_argument(
        "--script-here",
        action="store_true",
        help="run this checkout's benchmark on each commit's code (an option older scripts lack)",
    )
    parser.add_argument("--pure", action="store_true", help="leave each commit's C extensions unbuilt (Python only)")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        parser.error("give the benchmark after --, e.g. -- benchmarks/sim_speed.py --one-like-vidur")
    with tempfile.TemporaryDirectory(prefix="kvsched-commits-") as tmp:
        codes = [unpack(commit, Path(tmp)) for commit in args.commits]
        built = {short: not args.pure and build_extensions(short, folder) for short, folder in codes}
        runs: dict[str, list[float]] = {short: [] for short, _ in codes}
        for r in range(args.rounds):
            for short, folder in codes:
                runs[short].append(one_round(folder, command, args.key, args.script_here))
                print(f"round {r + 1} {short} {runs[short][-1]:g} (load {os.getloadavg()[0]:.2f})", file=sys.stderr)
    base = runs[codes[0][0]]
    base_median, base_fastest = statistics.median(base), min(base)
    print(f"{' '.join(command)}: {args.key}, {args.rounds} alternating rounds")
    print("| commit | C extensions | median | fastest | median / first's | fastest / first's | paired | rounds |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for short, values in runs.items():
        median, fastest = statistics.median(values), min(values)
        paired = statistics.median(v / b for v, b in zip(values, base, strict=True))
        print(
            f"| {short} | {'built' if built[short] else 'none'} | {median:g} | {fastest:g} "
            f"| {median / base_median:.3f} | {fastest / base_fastest:.3f} | {paired:.3f} "
            f"| {' '.join(f'{v:g}' for v in values)} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
