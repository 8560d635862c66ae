"""A run as a Perfetto / Chrome trace (the JSON trace event format), to open in ui.perfetto.dev.

Process 1, ``engine``: one slice per step on the ``steps`` track (named prefill, decode, mixed or
idle; its batch in the args: counts, the requests it admitted, chunked, swapped in or preempted),
and two counter tracks, the queue lengths and the KV blocks in use (a sample whenever they change).
Process 2,
``requests``: one track per request, in arrival order, with a slice per phase (queued, prefill,
decode, preempted, swapped; ``kvsched.metrics.phases``). Times are the engine clock, in µs. A
path ending in ``.gz`` is written gzip-compressed, which ui.perfetto.dev opens as it is.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

from kvsched.metrics.phases import all_phases, sampled_ids
from kvsched.metrics.timeseries import step_starts
from kvsched.reporting.files import RunFiles

ENGINE, REQUESTS = 1, 2
STEPS_TRACK = 1
_US = 1e6


def _us(seconds: float) -> float:
    return round(float(seconds) * _US, 1)


def step_name(prefill_tokens: int, decode_seqs: int) -> str:
    if prefill_tokens and decode_seqs:
        return "mixed"
    return "prefill" if prefill_tokens else "decode" if decode_seqs else "idle"


def trace_events(run: RunFiles):
    """Every event of the trace, metadata first (a generator: a long run's trace is never one list)."""
    steps, events, requests = run.steps, run.events, run.requests
    start = step_starts(steps)
    end = steps.time_s.to_numpy()
    for pid, name in ((ENGINE, "engine"), (REQUESTS, "requests")):
        yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}
        yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
    yield {"ph": "M", "name": "thread_name", "pid": ENGINE, "tid": STEPS_TRACK, "args": {"name": "steps"}}
    batch: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for step, event, rid in zip(events.step, events.event, events.request_id):
        if event in ("admitted", "prefill", "swapped_in", "preempted") and isinstance(rid, str):
            batch[int(step)][event].append(rid)
    cols = (
        "prefill_groups",
        "prefill_tokens",
        "decode_seqs",
        "kv_tokens_read",
        "blocks_swapped_in",
        "blocks_swapped_out",
        "finished",
    )
    queues = blocks = None
    for row in zip(
        steps.step,
        start,
        steps.duration_s,
        *(steps[c] for c in cols),
        steps.num_waiting,
        steps.num_running,
        steps.num_swapped,
        steps.gpu_blocks_used,
        steps.cpu_blocks_used,
    ):
        step, t0, dur = int(row[0]), row[1], row[2]
        counts = dict(zip(cols, (int(v) for v in row[3 : 3 + len(cols)])))
        args = {"step": step, **{k: v for k, v in counts.items() if v}, **batch.get(step, {})}
        yield {
            "ph": "X",
            "name": step_name(counts["prefill_tokens"], counts["decode_seqs"]),
            "cat": "step",
            "pid": ENGINE,
            "tid": STEPS_TRACK,
            "ts": _us(t0),
            "dur": _us(dur),
            "args": args,
        }
        waiting, running, swapped, gpu, cpu = (int(v) for v in row[-5:])
        if (waiting, running, swapped) != queues:
            queues = waiting, running, swapped
            yield {
                "ph": "C",
                "name": "queues",
                "pid": ENGINE,
                "ts": _us(t0 + dur),
                "args": {"waiting": waiting, "running": running, "swapped": swapped},
            }
        if (gpu, cpu) != blocks:
            blocks = gpu, cpu
            yield {
                "ph": "C",
                "name": "KV blocks used",
                "pid": ENGINE,
                "ts": _us(t0 + dur),
                "args": {"GPU": gpu, "CPU": cpu},
            }
    ids = sampled_ids(events, requests)
    phases = all_phases(events, requests, start, end, ids)
    tracks = (sid for rid in requests.sort_values("arrival_time", kind="stable").request_id for sid in ids[rid])
    for tid, rid in enumerate(tracks, start=1):  # a request fanned out under V1: a track for each child
        yield {"ph": "M", "name": "thread_name", "pid": REQUESTS, "tid": tid, "args": {"name": rid}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": REQUESTS, "tid": tid, "args": {"sort_index": tid}}
        for p in phases[rid]:
            args = {"request_id": rid, "first_step": p.first_step, "last_step": p.last_step}
            if p.detail:
                args["detail"] = p.detail
            yield {
                "ph": "X",
                "name": p.kind,
                "cat": "request",
                "pid": REQUESTS,
                "tid": tid,
                "ts": _us(p.start_s),
                "dur": _us(p.end_s - p.start_s),
                "args": args,
            }


def write_trace(run: RunFiles, path: Path) -> Path:
    """Write the trace to ``path`` (atomically: a temporary file renamed when complete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    s = run.summary
    meta = {
        "policy": s["policy"],
        "workload": s.get("workload"),
        "profile": s.get("profile"),
        "clock": "engine (simulated) seconds × 1e6",
    }
    with gzip.open(tmp, "wt", encoding="utf-8") if path.suffix == ".gz" else tmp.open("w", encoding="utf-8") as f:
        f.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(meta) + ',"traceEvents":[\n')
        encode = json.JSONEncoder(separators=(",", ":")).encode
        f.write(",\n".join(map(encode, trace_events(run))))
        f.write("\n]}\n")
    tmp.replace(path)
    return path
