"""Does the simulator predict the engine, policy by policy? Each policy simulated and served by real vLLM, same
workload.

For ``vllm-v1`` and the issue-23 proposals, one workload (the same requests and arrival times) is
simulated with the ``smollm2-135m-vllm-cpu`` cost model and served for real by ``engine serve
--policy NAME`` (vLLM 0.32 on SmolLM2-135M, fp32, one CPU thread, the engine settings of
``fidelity_vllm.py``), measured by ``engine bench``. By default the profile is fitted first, in
the same run, to vLLM's own steps (``--profile fit``: ``fidelity_vllm.calibrate``; the fitted step
cost on this machine moved from 22 ms to 89-110 ms between two days), else ``--profile`` names a
built-in profile or a JSON file. The baseline is served ``--repeats`` times (first, in the middle,
last) to measure the machine's noise. Writes ``fidelity-policies.json`` and ``.md`` under
``--out``: each policy's simulated and measured gain against vllm-v1 side by side, and each run's
simulation error (``kvsched.experiments.fidelity``). The next server starts while one is measured
(a start takes minutes on this machine); ``--sequential`` starts each after the last ends.
``--workload tiered-sessions`` serves multi-turn sessions with SLO classes instead (the prefix-aware
and tiered proposals' workload): each class's mean TTFT is compared as well.

    # 11 servers (8, --sequential, took 33 min on the idle machine)
    .venv/bin/python benchmarks/fidelity_policies.py --out docs/figures
    .venv/bin/python benchmarks/fidelity_policies.py --out OUT --workload tiered-sessions --sequential \
        --order vllm-v1,sla-tiers,cache-affinity,vllm-v1,session-affinity,hrrn,vllm-v1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_servers as servers  # noqa: E402
from bench_args import bounded  # noqa: E402
from fidelity_vllm import FLAGS, calibrate, simulate_run  # noqa: E402

PROPOSALS = ("lcf", "residual-sjf", "session-affinity", "cache-affinity", "ewsjf", "sjf-aging", "sla-tiers", "hrrn")
# A queue builds (order matters) and 60 KV blocks of 32 tokens preempt (the victim matters); ~40 s of arrivals.
WORKLOAD = {
    "kind": "synthetic",
    "num_requests": 64,
    "arrivals": {"kind": "poisson", "rate": 2.5},
    "prompt": {"kind": "lognormal", "median": 200, "sigma": 0.9, "max": 700},
    "output": {"kind": "lognormal", "median": 40, "sigma": 0.6, "max": 160},
    "seed": 23,
}
# The prefix-aware and tiered proposals' workload: multi-turn sessions on 4 shared system prompts, each
# session interactive, batch or background (sla-tiers' tiers); same engine settings, ~30 s of sessions starting.
TIERED_SESSIONS = {
    "kind": "sessions",
    "num_sessions": 24,
    "rate": 0.8,
    "turns": {"kind": "uniform", "low": 2, "high": 4},
    "think_time_s": 4.0,
    "system_prompts": 4,
    "system_len": 192,
    "user": {"kind": "lognormal", "median": 40, "sigma": 0.6, "max": 160},
    "output": {"kind": "lognormal", "median": 30, "sigma": 0.6, "max": 100},
    "max_context": 900,
    "slo_classes": {"interactive": 0.3, "batch": 0.4, "background": 0.3},
    "seed": 23,
}
WORKLOADS = {"default": WORKLOAD, "tiered-sessions": TIERED_SESSIONS}
BLOCKS = 60
KEEP = ("finished", "duration_s", "ttft_s", "tpot_s", "e2e_s", "preemptions")
MAX_REPEATS = 20  # each a server started and a workload replayed: minutes
OUT_FILES = ("fidelity-policies.json", "fidelity-policies.md")
RUN_KEYS = ("policy", "label", "sim", "real", "errors")  # what a saved run holds, for --resume


def schedule(policies: list[str], repeats: int, baseline: str = "vllm-v1") -> list[str]:
    """The serving order: the baseline first, again at even intervals among the others, and last."""
    others = [p for p in policies if p != baseline]
    if repeats < 2:
        return [baseline, *others]
    order, cut = [baseline], len(others) / (repeats - 1)
    for k in range(repeats - 1):
        order += [*others[round(k * cut) : round((k + 1) * cut)], baseline]
    return order


def serve_command(policy: str, port: int, blocks: int = BLOCKS) -> list[str]:
    return [
        str(servers.ENGINE),
        "serve",
        "--policy",
        policy,
        "--port",
        str(port),
        "--",
        *FLAGS,
        "--num-gpu-blocks-override",
        str(blocks),
    ]


def start(policy: str, log: Path, blocks: int = BLOCKS):
    port = servers.free_port()
    return port, servers.start(serve_command(policy, port, blocks), port, log=log)


def checked(parser: argparse.ArgumentParser, args: argparse.Namespace, order: list[str]):
    """What the run needs, checked before a server starts (each a usage error naming its option): the policies
    served, the profile (None: fitted in the run), the folders written, and --resume's saved runs."""
    from kvsched.errors import KvschedError
    from kvsched.executors.profiles import resolve_profile
    from kvsched.plugins.discovery import load_policy
    from kvsched.reporting.destination import check_folder
    from kvsched.userfiles.reader import read_json

    saved = args.out / OUT_FILES[0]
    try:
        for policy in dict.fromkeys(order):
            load_policy(policy)
        profile = None if args.profile == "fit" else resolve_profile(args.profile)
        check_folder(args.out, OUT_FILES, "--out")
        check_folder(args.workdir, (), "--workdir")
        data = read_json(saved, "--resume file") if args.resume and saved.exists() else {"runs": []}
    except (KvschedError, ValueError) as exc:
        parser.error(str(exc))
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and all(k in r for k in RUN_KEYS) and isinstance(r["label"], str) for r in runs
    ):
        parser.error(
            f"--resume: {saved} holds no runs as this script writes them "
            f"(a list under 'runs', each with {', '.join(RUN_KEYS)})"
        )
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    return profile, runs


def main(argv=None) -> None:
    from kvsched.experiments import fidelity

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for fidelity-policies.json and .md")
    parser.add_argument(
        "--workdir", type=Path, default=Path("/tmp/kvsched-fidelity-policies"), help="bench result folders"
    )
    parser.add_argument("--policies", default=",".join(("vllm-v1", *PROPOSALS)))
    parser.add_argument("--repeats", type=bounded(int, 1, MAX_REPEATS), default=3, help="times the baseline is served")
    parser.add_argument(
        "--requests",
        type=bounded(int, 1, 100_000),
        help=f"requests of the default workload ({WORKLOAD['num_requests']})",
    )
    parser.add_argument(
        "--workload",
        default="default",
        help=f"{' or '.join(WORKLOADS)}, or a workload spec (JSON file); "
        "with SLO classes, each class's mean TTFT is compared too",
    )
    parser.add_argument(
        "--kv-blocks", type=bounded(int, 1, 1_000_000), default=BLOCKS, help="vLLM's KV blocks of 32 tokens, both sides"
    )
    parser.add_argument("--sequential", action="store_true", help="start each server only after the last one stopped")
    parser.add_argument(
        "--order", help="the serving order, comma-separated (default: the baseline first, --repeats times in all)"
    )
    parser.add_argument(
        "--profile",
        default="fit",
        help="fit (to vLLM's steps, first, in this run), a built-in profile's name or a JSON file",
    )
    parser.add_argument("--resume", action="store_true", help="keep --out's runs and serve only the ones it lacks")
    args = parser.parse_args(argv)
    if args.requests is not None and args.workload != "default":
        parser.error("--requests sizes the default workload only; give the size in the workload's own spec")
    order = args.order.split(",") if args.order else schedule(args.policies.split(","), args.repeats)
    labels = [f"{p} #{order[: i + 1].count(p)}" if order.count(p) > 1 else p for i, p in enumerate(order)]
    profile, saved_runs = checked(parser, args, order)
    spec = args.workdir / "workload.json"
    from kvsched.userfiles.reader import FileError
    from kvsched.workloads import build_workload

    workload = WORKLOADS.get(args.workload)
    try:  # the workload checked before a server starts; a file's errors name the file
        source = spec if workload is not None else Path(args.workload)
        if workload is not None:
            spec.write_text(
                json.dumps(
                    dict(workload, num_requests=args.requests or workload["num_requests"])
                    if workload is WORKLOAD
                    else workload
                )
            )
        classes = {r.request_id: r.slo_class for r in build_workload(str(source)).iter_requests()}
        if workload is None:
            spec.write_text(source.read_text())
    except (
        OSError,
        ValueError,
        FileError,
    ) as exc:  # a missing or unreadable file, or a spec the workload reader refuses
        parser.error(f"--workload {args.workload}: {exc}")
    profile = profile or calibrate(args.workdir / "calibration")
    sims = {}
    for policy in dict.fromkeys(order):
        result = simulate_run(spec, args.kv_blocks, profile, policy)
        ttft = {r.request_id: r.ttft for r in result.requests if r.ttft is not None}
        sims[policy] = (
            {**{k: result.summary[k] for k in KEEP}, **fidelity.class_means(ttft, classes)},
            {r.request_id: r.e2e for r in result.requests if r.e2e is not None},
        )
    result = {
        "workload": json.loads(spec.read_text()),
        "kv_blocks": args.kv_blocks,
        "vllm_flags": FLAGS,
        "profile": {
            "source": args.profile,
            **profile.model_dump(include={"name", "base_ms", "prefill_token_ms", "decode_seq_ms", "kv_token_ms"}),
        },
        "pipelined": not args.sequential,
        "command": "benchmarks/fidelity_policies.py " + " ".join(argv or sys.argv[1:]),
        "runs": [],
        "gains": [],
    }
    saved = args.out / OUT_FILES[0]
    result["runs"] = [r for r in saved_runs if r["label"] in labels]
    done = {r["label"] for r in result["runs"]}
    order, labels = [p for p, lab in zip(order, labels) if lab not in done], [lab for lab in labels if lab not in done]
    if not order:  # every run resumed: the tables again, from them
        result["gains"] = fidelity.build(result["runs"])
        saved.write_text(json.dumps(result, indent=1) + "\n")
        (args.out / OUT_FILES[1]).write_text(fidelity.markdown(result))
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(start, order[0], args.workdir / "server-0.log", args.kv_blocks) if order else None
        for i, policy in enumerate(order):
            label = labels[i]
            folder = args.workdir / label.replace(" #", "-")
            try:
                port, proc = pending.result()
            except (Exception, SystemExit) as exc:  # a server that did not start is reported, and the run goes on
                result["failed"] = [*result.get("failed", []), {"label": label, "error": str(exc)[:300]}]
                print(f"{label}: {exc}", flush=True)
                if i + 1 < len(order):
                    pending = pool.submit(start, order[i + 1], args.workdir / f"server-{i + 1}.log", args.kv_blocks)
                continue
            try:
                if not args.sequential and i + 1 < len(order):
                    pending = pool.submit(start, order[i + 1], args.workdir / f"server-{i + 1}.log", args.kv_blocks)
                began = time.strftime("%H:%M:%S", time.gmtime())
                real = servers.bench(port, label, spec, folder)
            except Exception as exc:  # a failed bench is reported, and the run goes on
                real = None
                result["failed"] = [*result.get("failed", []), {"label": label, "error": str(exc)[:300]}]
            finally:
                servers.stop(proc)
            if args.sequential and i + 1 < len(order):
                pending = pool.submit(start, order[i + 1], args.workdir / f"server-{i + 1}.log", args.kv_blocks)
            if real is None:
                continue
            sim, sim_e2e = sims[policy]
            errors = fidelity.sim_errors(sim, real, sim_e2e, fidelity.by_request(folder))
            result["runs"].append(
                {
                    "policy": policy,
                    "label": label,
                    "started_utc": began,
                    "sim": sim,
                    "real": {
                        **{k: real[k] for k in KEEP if k != "preemptions"},
                        "preemptions": {"recompute": int(real["server_counters"]["preemptions"]), "swap": 0},
                        **fidelity.class_means(fidelity.by_request(folder, "ttft"), classes),
                    },
                    "errors": errors,
                }
            )
            result["gains"] = fidelity.build(result["runs"])
            saved.write_text(json.dumps(result, indent=1) + "\n")  # after every run: a partial table survives
            (args.out / "fidelity-policies.md").write_text(fidelity.markdown(result))
            print(
                f"{label}: measured mean TTFT {fidelity.metric(real, 'ttft_mean'):.2f} s, simulated "
                f"{fidelity.metric(sim, 'ttft_mean'):.2f} s",
                flush=True,
            )
    print(fidelity.markdown(result))


if __name__ == "__main__":
    main()
