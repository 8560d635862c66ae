"""``engine explain`` on a fleet's folder (``engine run --replicas``): the router's decisions, as text.

How the requests spread over the replicas and the commonest reasons, or where one request went, why,
and how it ended there. Plain lines, as a single run's explanation (``explain.py``).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from kvsched.reporting.reading import read_csv, read_summary

# What explaining a fleet reads of its files: routes.csv, requests.csv (the columns, those never empty), summary.json.
ROUTES = pa.schema(
    [
        ("request_id", pa.string()),
        ("pool", pa.string()),
        ("time", pa.float64()),
        ("replica", pa.string()),
        ("reason", pa.string()),
    ]
)
ROUTED = ("request_id", "pool", "time", "replica")
FLEET_REQUESTS = pa.schema(
    [
        ("request_id", pa.string()),
        ("status", pa.string()),
        ("replica", pa.int64()),
        ("prompt_replica", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("queueing_time", pa.float64()),
        ("ttft", pa.float64()),
        ("e2e", pa.float64()),
    ]
)
ENDED = ("request_id", "status", "replica", "prompt_replica", "prompt_tokens", "cached_tokens")
FLEET_SUMMARY = {"replicas": [{"replica": str}]}


def explain_fleet(run_dir: Path, request: str | None) -> list[str]:
    """``engine explain DIR`` on a fleet's folder (``engine run --replicas``): where the router sent
    each request and why; one request with ``request``, else how the requests spread over the
    replicas and the commonest reasons. Its files are read as every results file is (``reading.py``)."""
    path = run_dir / "routes.csv"
    routes = read_csv(path, ROUTES, ROUTED)
    if request is not None:
        mine = routes.filter(pc.equal(routes["request_id"], request)).to_pylist()
        if not mine:
            raise KeyError(f"request {request!r} is not in {path}")
        lines = [
            f"{r['time']:.4f} s  {r['pool']} pool → {r['replica']}: {r['reason'] or '(the router gave no reason)'}"
            for r in mine
        ]
        return lines + _fleet_outcome(run_dir, request)
    counts = pc.value_counts(routes["replica"]).to_pylist()
    reasons: dict[str, int] = {}
    for reason in routes["reason"].to_pylist():
        kind = (reason or "(no reason given)").split(":")[0]
        reasons[kind] = reasons.get(kind, 0) + 1
    n = routes.num_rows
    lines = [f"{n} routing decisions over {len(counts)} replicas"]
    lines += [
        f"  {c['values']}: {c['counts']} ({c['counts'] / n:.1%})" for c in sorted(counts, key=lambda c: -c["counts"])
    ]
    lines.append("commonest reasons:")
    lines += [f"  {k:>8}  {kind}" for kind, k in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]]
    return lines


def _fleet_outcome(run_dir: Path, request: str) -> list[str]:
    """How the request ended, from the fleet's requests.csv: where it finished, its latencies, its cache hits."""
    table = read_csv(run_dir / "requests.csv", FLEET_REQUESTS, ENDED)
    rows = table.filter(pc.equal(table["request_id"], request)).to_pylist()
    if not rows:
        return []
    names = [r["replica"] for r in read_summary(run_dir / "summary.json", FLEET_SUMMARY)["replicas"]]
    row, name = rows[0], lambda i: names[i] if 0 <= i < len(names) else f"replica #{i}"
    moved = row["prompt_replica"] != row["replica"]
    where = name(row["replica"]) + (f" (its prompt ran on {name(row['prompt_replica'])})" if moved else "")
    seconds = lambda v: "–" if v is None else f"{v:.4f} s"  # noqa: E731
    return [
        f"ended {row['status']} on {where}: queued {seconds(row['queueing_time'])}, TTFT {seconds(row['ttft'])}, "
        f"e2e {seconds(row['e2e'])}; {row['cached_tokens']} of its {row['prompt_tokens']} prompt tokens found in "
        "that replica's prefix cache"
    ]
