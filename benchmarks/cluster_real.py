"""Issue 24's first shape for real: prefix-affinity against round-robin (and Ray's own prefix router) on
multi-turn sessions, two SmolLM2-135M replicas behind Ray Serve, with the cluster simulator beside it.

Each router gets a fresh fleet (``integrations/ray/fleet.py``: two ``engine serve --policy vllm-v1``
replicas, vLLM 0.32 on the CPU, one torch thread each; at least 2 idle cores) and the same sessions workload, replayed
by ``engine bench`` through the fleet's one URL (a sessions workload's ids are folded into the model's
vocabulary with their sharing kept). Measured: TTFT and E2E from the client, and prefix-cache hits
from each replica's own ``vllm:prefix_cache_hits`` / ``queries`` counters (tokens). Simulated: the same
requests through ``Cluster`` with two ``vllm-v1`` replicas on the ``smollm2-135m-vllm-cpu`` profile
with the served engines' settings. Ray's ``PrefixCacheAffinityRouter`` has no simulated twin. Writes
``cluster-real.json`` and ``.md`` under ``--out``.

    .venv/bin/python benchmarks/cluster_real.py --out docs/figures     # three fleets: about 15 min on 2 idle cores
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_servers import ENGINE, counters  # noqa: E402

PROFILE = "smollm2-135m-vllm-cpu"
SETTINGS = {"block_size": 32, "max_model_len": 2048, "max_num_seqs": 32, "max_num_batched_tokens": 512}
VLLM_ARGS = ("--max-model-len", "2048", "--max-num-seqs", "32", "--max-num-batched-tokens", "512")
KV_CACHE_GIB = 1
# 16 sessions of 3-5 turns on 4 system prompts of 256 tokens, a turn every 12 s on average: ~68 requests.
WORKLOAD = {
    "kind": "sessions",
    "num_sessions": 16,
    "rate": 0.2,
    "turns": {"kind": "uniform", "low": 3, "high": 5},
    "think_time_s": 12.0,
    "system_prompts": 4,
    "system_len": 256,
    "user": {"kind": "lognormal", "median": 48, "sigma": 0.5, "max": 128},
    "output": {"kind": "lognormal", "median": 24, "sigma": 0.4, "max": 48},
    "max_context": 1536,
    "seed": 0,
}
RAY_ROUTER = "ray.serve.llm.request_router:PrefixCacheAffinityRouter"
ROUTERS = {
    "round-robin": {"router": "round-robin"},
    "prefix-affinity": {"router": "prefix-affinity"},
    "ray PrefixCacheAffinityRouter": {"router_class": RAY_ROUTER, "router_kwargs": {}},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica_servers() -> list[str]:
    """The URLs of the fleet's vLLM servers (``engine serve`` execs into ``kvsched.integrations.vllm.server``;
    each is a child of a Serve replica actor)."""
    import psutil

    urls = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "kvsched.integrations.vllm.server" in cmd and proc.parent() and proc.parent().name().startswith("ray::"):
            urls.append(f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}")
    return sorted(set(urls))


def measure(name: str, fleet: dict, spec: Path, workdir: Path) -> dict:
    """One fleet behind one router: start it, bench the workload through it, read the replicas' counters."""
    from kvsched.integrations.ray.fleet import start_fleet, stop_fleet, wait_ready

    started = time.monotonic()
    url = start_fleet(
        free_port(), replicas=2, policy="vllm-v1", kv_cache_gib=KV_CACHE_GIB, vllm_args=VLLM_ARGS, **fleet
    )
    try:
        wait_ready(url)
        startup_s = time.monotonic() - started
        servers = replica_servers()
        if len(servers) != 2:
            raise RuntimeError(f"found {len(servers)} replica servers, not 2: their counters cannot be read")
        before = [counters(s) for s in servers]
        out = workdir / name.replace(" ", "-")
        subprocess.run(
            [str(ENGINE), "bench", "--url", url, "--workload", str(spec), "--output", str(out), "-q", "--label", name],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        after = [counters(s) for s in servers]
    finally:
        stop_fleet()
    summary = json.loads((out / "summary.json").read_text())
    hits = sum(a["prefix_cache_hits"] - b["prefix_cache_hits"] for a, b in zip(after, before))
    queries = sum(a["prefix_cache_queries"] - b["prefix_cache_queries"] for a, b in zip(after, before))
    return {
        "router": name,
        "replicas": len(servers),
        "startup_s": round(startup_s, 1),
        "finished": summary["finished"],
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "ttft_s": summary["ttft_s"],
        "e2e_s": summary["e2e_s"],
        "duration_s": summary["duration_s"],
    }


def simulate(name: str) -> dict:
    from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
    from kvsched.cluster.summary import fleet_summary
    from kvsched.executors.cost_model import SMOLLM2_KV_BYTES_PER_TOKEN
    from kvsched.workloads.sessions import SessionSpec

    blocks = (KV_CACHE_GIB << 30) // (SETTINGS["block_size"] * SMOLLM2_KV_BYTES_PER_TOKEN)
    settings = {
        **SETTINGS,
        "vllm_engine": "v1",
        "num_gpu_blocks": blocks,
        "num_cpu_blocks": 0,
        "watermark": 0.0,
        "enable_prefix_caching": True,
    }
    cluster = Cluster(
        FleetSpec(replicas=[ReplicaGroup(count=2, policy="vllm-v1", profile=PROFILE, settings=settings)], router=name)
    )
    cluster.run(SessionSpec(**WORKLOAD).requests())
    s = fleet_summary(cluster)
    return {
        "router": name,
        "finished": s["finished"],
        "prefix_hit_rate": s["prefix_hit_rate"],
        "ttft_s": s["ttft_s"],
        "e2e_s": s["e2e_s"],
        "duration_s": s.get("duration_s"),
    }


def markdown(result: dict) -> str:
    lines = [
        "| router | side | finished | prefix-cache hits (tokens) | TTFT mean s | TTFT p50 s | TTFT p99 s | E2E mean "
        "s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in ("measured", "simulated"):
        for row in result[side]:
            t, e = row["ttft_s"], row["e2e_s"]
            lines.append(
                f"| {row['router']} | {side} | {row['finished']} | {row['prefix_hit_rate']:.1%} | {t['mean']:.3f} | "
                f"{t['p50']:.3f} | {t['p99']:.3f} | {e['mean']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for cluster-real.json and .md")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kvsched-cluster-real"))
    parser.add_argument("--routers", default=",".join(ROUTERS), help="comma-separated, of: " + ", ".join(ROUTERS))
    args = parser.parse_args()
    from kvsched.experiments.ray_backend import start_ray

    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    spec = args.workdir / "sessions.json"
    spec.write_text(json.dumps(WORKLOAD))
    names = args.routers.split(",")
    result = {
        "workload": WORKLOAD,
        "vllm_args": VLLM_ARGS,
        "kv_cache_gib": KV_CACHE_GIB,
        "profile": PROFILE,
        "command": "benchmarks/cluster_real.py " + " ".join(sys.argv[1:]),
        "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "simulated": [simulate(n) for n in names if n in ("round-robin", "prefix-affinity")],
        "measured": [],
    }
    start_ray(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for name in names:
        result["measured"].append(measure(name, ROUTERS[name], spec, args.workdir))
        (args.out / "cluster-real.json").write_text(
            json.dumps(result, indent=1) + "\n"
        )  # after each fleet: a partial table survives
        (args.out / "cluster-real.md").write_text(markdown(result))
        print(markdown(result), flush=True)


if __name__ == "__main__":
    main()
