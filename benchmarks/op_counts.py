"""Bytecodes executed per function in one simulation loop: a cost that is the same on every run whatever the load.

On a shared machine a CPU-time ratio of a few percent needs many alternating rounds; the count of bytecodes the
loop executes (``sys.settrace`` with opcode events) is exact and repeatable, and per function it says where two
codes differ: many more calls of a cheap function show as plainly as one slow function. Run it on each code (the
code first on ``PYTHONPATH``, e.g. a ``git archive`` of a commit as ``benchmarks/commits_speed.py`` unpacks it),
then compare the two files (a fresh process each, its string hashes fixed: they order sets):

    PYTHONHASHSEED=0 PYTHONPATH=/tmp/a .venv/bin/python benchmarks/op_counts.py engine 2000 a.json
    PYTHONHASHSEED=0 PYTHONPATH=/tmp/b .venv/bin/python benchmarks/op_counts.py engine 2000 b.json
    .venv/bin/python benchmarks/op_counts.py --diff a.json b.json

``engine N``: ``sim_speed.py --one-like-vidur``'s engine on the first N requests of its trace; ``fleet N``:
``cluster_speed.py``'s 16 replicas on N requests (pandas imported first: pyarrow imports it on its first array).
Only ``run`` is counted. A bytecode is not a fixed cost (a call costs more than an add), so confirm a finding with
``commits_speed.py``.
"""

from __future__ import annotations

import gc
import json
import sys
from collections import Counter
from pathlib import Path


def count(kind: str, n: int) -> dict[str, Counter]:
    """The bytecodes and calls of each function (``path inside kvsched:name``) in the loop of ``kind``."""
    import kvsched

    ops, calls = Counter(), Counter()
    root = str(Path(kvsched.__file__).parent) + "/"  # the package's folder, whatever the checkout is called

    def name(code) -> str:
        path = code.co_filename
        return f"{path[len(root) :] if path.startswith(root) else path.rsplit('/', 1)[-1]}:{code.co_name}"

    def each_op(frame, event, _arg):
        if event == "opcode":
            ops[name(frame.f_code)] += 1
        return each_op

    def each_call(frame, event, _arg):
        if event == "call":
            frame.f_trace_opcodes = True
            calls[name(frame.f_code)] += 1
            return each_op
        return None

    if kind == "engine":
        from kvsched import Engine, EngineConfig, SimulatedExecutor
        from kvsched.workloads import build_workload

        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from sim_speed import LIKE_VIDUR, VIDUR_MAX_TOKENS

        requests = build_workload("azure-conv", max_total_tokens=VIDUR_MAX_TOKENS, num_requests=n).requests()
        engine = Engine(EngineConfig(**LIKE_VIDUR), "vllm-default", SimulatedExecutor("llama2-7b-a100"))
        run = lambda: engine.run(requests)  # noqa: E731
    else:
        import pandas  # noqa: F401  (what pyarrow imports on its first array: not the loop's)

        from kvsched.cluster import Cluster, FleetSpec, ReplicaGroup
        from kvsched.workloads.arrivals import Poisson
        from kvsched.workloads.synthetic import SyntheticSpec

        cluster = Cluster(
            FleetSpec(replicas=[ReplicaGroup(count=16, policy="vllm-default")], router="vllm-dp", staleness_s=0.05)
        )
        arriving = SyntheticSpec(num_requests=n, arrivals=Poisson(rate=4.0 * 16), seed=0).iter_requests()
        run = lambda: cluster.run(arriving)  # noqa: E731
    gc.collect()
    sys.settrace(each_call)
    try:
        run()
    finally:
        sys.settrace(None)
    return {"ops": ops, "calls": calls}


def diff(a: dict, b: dict, top: int = 40) -> str:
    """The functions whose bytecodes differ most from ``a`` to ``b``, with their calls."""
    total_a, total_b = sum(a["ops"].values()), sum(b["ops"].values())
    lines = [f"bytecodes {total_a:,} -> {total_b:,} ({total_b / total_a - 1:+.2%})", ""]
    lines += ["| function | bytecodes | calls | bytecodes a -> b | calls a -> b |", "|---|---:|---:|---|---|"]
    names = set(a["ops"]) | set(b["ops"])
    rows = sorted(names, key=lambda k: -abs(b["ops"].get(k, 0) - a["ops"].get(k, 0)))[:top]
    for k in rows:
        oa, ob, ca, cb = a["ops"].get(k, 0), b["ops"].get(k, 0), a["calls"].get(k, 0), b["calls"].get(k, 0)
        lines.append(f"| {k} | {ob - oa:+,} | {cb - ca:+,} | {oa:,} -> {ob:,} | {ca:,} -> {cb:,} |")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--diff"] and len(argv) == 3:
        a, b = (json.loads(open(path).read()) for path in argv[1:])
        print(diff(a, b))
    elif len(argv) == 3 and argv[0] in ("engine", "fleet") and argv[1].isdigit():
        counted = count(argv[0], int(argv[1]))
        with open(argv[2], "w") as out:
            json.dump(counted, out)
        print(json.dumps({"bytecodes": sum(counted["ops"].values()), "calls": sum(counted["calls"].values())}))
    else:
        sys.exit("usage: op_counts.py engine|fleet N OUT.json, or op_counts.py --diff A.json B.json")


if __name__ == "__main__":
    main(sys.argv[1:])
