"""A fleet run's numbers: the fleet's summary (the single engine's ``summary.json`` fields, over
every request) and one row per replica (its load, its requests' latencies, its prefix-cache hits)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kvsched.metrics.recompute import recompute_summary
from kvsched.metrics.requests import distribution, done_mask, numbers, summarize

if TYPE_CHECKING:
    from kvsched.cluster.loop import Cluster


def fleet_table(cluster: Cluster) -> pa.Table:
    """Every request's record, with the replica that finished it, the one that ran its prompt, and its prefix-cache
    hits: a single run's columns, then ``cluster/records.py``'s ``EXTRA``, in the order the requests arrived."""
    return cluster.records.table


def fleet_summary(cluster: Cluster, table: pa.Table | None = None, **extra: Any) -> dict:
    """The fleet's summary: the engine summary's fields over all requests, the router and its
    staleness, the prefix-cache hit rate, and ``replicas``, one dict each."""
    table = fleet_table(cluster) if table is None else table
    replicas = cluster.replicas
    policies = sorted({r.engine.policy_name for r in replicas})
    summary = summarize(
        None, table, policy=policies[0] if len(policies) == 1 else "+".join(policies), config=None, **extra
    )
    profiles = sorted({r.profile_name for r in replicas})
    summary["profile"] = profiles[0] if len(profiles) == 1 else "+".join(profiles)
    summary["steps"] = sum(r.steps for r in replicas)
    summary["blocks_swapped_in"] = sum(r.engine.num_blocks_swapped_in for r in replicas)
    summary["blocks_swapped_out"] = sum(r.engine.num_blocks_swapped_out for r in replicas)
    summary["leaked_blocks"] = sum(r.engine.leaked_blocks for r in replicas)
    summary["preemptions"] = {
        "recompute": int(numbers(table, "preemptions_recompute").sum()),
        "swap": int(numbers(table, "preemptions_swap").sum()),
    }
    summary["recompute"] = recompute_summary(table)  # each row's counts are the fleet's (cluster/records.py)
    prompt = numbers(table, "prompt_tokens")
    cached = numbers(table, "cached_tokens")
    summary["prefix_hit_rate"] = float(cached.sum() / prompt.sum()) if prompt.sum() else 0.0
    summary["fleet"] = {
        "replicas": len(replicas),
        "router": cluster.router.name,
        "staleness_s": cluster.staleness,
        "disaggregated": cluster.disaggregated,
        "prefill_replicas": sum(r.role == "prefill" for r in replicas),
        "decode_replicas": sum(r.role == "decode" for r in replicas),
        "transfer": cluster.spec.transfer.model_dump() if cluster.disaggregated else None,
    }
    summary["replicas"] = replica_rows(cluster, table, summary["duration_s"])
    return summary


def replica_rows(cluster: Cluster, table: pa.Table, duration: float) -> list[dict]:
    """Per replica: what it was sent and served, how busy it was, its requests' TTFT and end-to-end
    latency (those whose prompt ran there, for TTFT; those it finished, for end-to-end), its prefix hits."""
    done = done_mask(table)
    finished_on, prompt_on = numbers(table, "replica"), numbers(table, "prompt_replica")
    ttft, e2e = numbers(table, "ttft"), numbers(table, "e2e")
    prompt, cached, out = (
        numbers(table, "prompt_tokens"),
        numbers(table, "cached_tokens"),
        numbers(table, "output_tokens"),
    )
    rows = []
    for r in cluster.replicas:
        ran_prompt, finished_here = prompt_on == r.index, finished_on == r.index
        prompts = prompt[ran_prompt].sum()
        rows.append(
            {
                "replica": r.name,
                "role": r.role,
                "policy": r.engine.policy_name,
                "profile": r.profile_name,
                "routed": r.requests,
                "finished": int((finished_here & done).sum()),
                "steps": r.steps,
                "busy": r.busy_s / duration if duration > 0 else 0.0,
                "output_tokens": int(out[finished_here & done].sum()),
                "ttft_s": distribution(ttft[ran_prompt & done]),
                "e2e_s": distribution(e2e[finished_here & done]),
                "prefix_hit_rate": float(cached[ran_prompt].sum() / prompts) if prompts else 0.0,
                "leaked_blocks": r.engine.leaked_blocks,
            }
        )
    return rows


def route_table(cluster: Cluster) -> pa.Table:
    """The router's decisions: request, pool, time, replica (by name) and the router's reason."""
    names = [r.name for r in cluster.replicas]
    routes = cluster.records.routes
    return pa.table(
        {
            "request_id": pa.array([route.request_id for route in routes], pa.string()),
            "pool": pa.array([route.pool for route in routes], pa.string()),
            "time": pa.array([route.time for route in routes], pa.float64()),
            "replica": pa.array([names[route.replica] for route in routes], pa.string()),
            "reason": pa.array([route.reason for route in routes], pa.string()),
        }
    )
