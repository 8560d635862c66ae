"""A command's resident memory over time: is a long run's memory flat after warm-up?

Runs the command, samples its RSS (``/proc/PID/status``, Linux) every ``--every`` seconds and
prints ``seconds  RSS MB`` lines, then the peak (``ru_maxrss`` of the child), its CPU seconds
(user + system: on a shared machine, what one core spent on it) and the wall time.

    .venv/bin/python benchmarks/rss_over_time.py --every 30 -- .venv/bin/engine run -q --workload synthetic -n 10000000
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    print(f"{'seconds':>8} {'RSS MB':>8}", flush=True)
    while child.poll() is None:
        rss = rss_mb(child.pid)
        if rss is not None:
            print(f"{time.perf_counter() - start:8.0f} {rss:8.0f}", flush=True)
        try:
            child.wait(timeout=args.every)
        except subprocess.TimeoutExpired:
            pass
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        f"exit {child.returncode}; wall {time.perf_counter() - start:.0f} s; CPU "
        f"{usage.ru_utime + usage.ru_stime:.0f} s; peak RSS {usage.ru_maxrss / 1024:,.0f} MB",
        flush=True,
    )
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
