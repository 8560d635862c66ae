"""How much a sweep gains from Ray on this machine's cores: serial, process pool and Ray, same run.

One grid (``--policies`` × ``max_num_seqs`` values) on the synthetic workload runs three times:
one point after another in this process, on the process pool of ``-j`` workers, and as Ray tasks on
a local Ray of ``-j`` CPUs that the sweep starts and stops (its start-up is part of its time, as it
is for ``engine sweep --ray``). Prints one JSON line: the wall seconds of each, the speed-ups over
the serial run, Ray's ratio to the pool, and whether all three gave the same rows (``wall_s`` aside).

    .venv/bin/python benchmarks/sweep_ray.py                 # 8 points of 3,000 requests, -j = CPUs
    .venv/bin/python benchmarks/sweep_ray.py -n 500 -j 2     # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--num-requests", type=int, default=3000)
    parser.add_argument("-j", "--workers", type=int, default=os.cpu_count())
    parser.add_argument("--policies", default="vllm-default,fcfs")
    parser.add_argument("--max-num-seqs", default="16,32,64,128")
    args = parser.parse_args()

    from kvsched.experiments.sweep import SweepSpec, grid_points, parse_grid, run_sweep

    spec = SweepSpec({"workload": "synthetic", "num_requests": args.num_requests, "seed": 0})
    points = grid_points(args.policies.split(","), parse_grid([f"max_num_seqs={args.max_num_seqs}"]))
    walls, rows = {}, {}
    for name, kwargs in (
        ("serial", {"workers": 1}),
        ("pool", {"workers": args.workers}),
        ("ray", {"workers": args.workers, "ray_address": "local"}),
    ):
        start = time.perf_counter()
        rows[name] = [{k: v for k, v in r.items() if k != "wall_s"} for r in run_sweep(spec, points, **kwargs)]
        walls[name] = time.perf_counter() - start
    print(
        json.dumps(
            {
                "points": len(points),
                "requests_per_point": args.num_requests,
                "workers": args.workers,
                "cpus": os.cpu_count(),
                "serial_s": round(walls["serial"], 1),
                "pool_s": round(walls["pool"], 1),
                "ray_s": round(walls["ray"], 1),
                "pool_speedup": round(walls["serial"] / walls["pool"], 2),
                "ray_speedup": round(walls["serial"] / walls["ray"], 2),
                "ray_over_pool": round(walls["ray"] / walls["pool"], 2),
                "identical_rows": rows["serial"] == rows["pool"] == rows["ray"],
                "load_average_1m": round(os.getloadavg()[0], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
