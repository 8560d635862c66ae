"""kvsched policies inside real vLLM on this CPU: what they cost, and what a policy buys.

1. Throughput and overhead. The 64-prompt workload of ``benchmarks/real_throughput.py`` (SmolLM2's
   chat template, output lengths uniform in 32-128, ``ignore_eos``, every request at t=0) through
   vLLM on SmolLM2-135M, fp32, one torch thread: vLLM's own scheduler against ``vllm-v1`` through
   ``KvschedScheduler``, alternating, a fresh engine process each run. Prints output tokens/s,
   the ratio, and the time each scheduler spends per step in ``schedule()`` + ``update_from_output()``
   (both sides run under the same step log, ``integrations/vllm/steplog.py``).
2. The seed's case study on a real engine: ``engine bench`` replays a workload with 20% VIP
   requests, at a rate that makes requests queue, against vLLM's OpenAI server with its own
   default (fcfs) scheduler, against vLLM with ``--scheduling-policy priority`` (the baseline a
   user tries first: VIPs sent with priority 0, the others 1) and against ``engine serve --policy
   priority-vip --policy-opt aging_s=10``, alternating for ``--rounds``, the same arrivals and
   lengths for all three. Prints each side's VIP and other p99 TTFT and output throughput per
   round, and the ratios (mean and range over rounds) of ours against each of vLLM's and of vLLM's
   priority against its fcfs.

    .venv/bin/python benchmarks/vllm_integration.py                 # both parts, about 20 minutes here
    .venv/bin/python benchmarks/vllm_integration.py --part throughput --rounds 2
    .venv/bin/python benchmarks/vllm_integration.py --part case-study --rounds 2 --workdir /tmp/case
    # again, from the kept folders
    .venv/bin/python benchmarks/vllm_integration.py --part case-study --rounds 2 --workdir /tmp/case --summarize
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import vllm_servers as servers

from kvsched.metrics.requests import percentile

PY = sys.executable
VLLM_ARGS = dict(
    dtype="float32",
    enforce_eager=True,
    block_size=32,
    max_model_len=2048,
    max_num_seqs=64,
    max_num_batched_tokens=512,
    distributed_executor_backend="uni",
)
AGING_S = 10  # priority-vip's VIP boost (4 levels) is then 40 s of waiting: fcfs's queue here is shorter than that
CASE_WORKLOAD = {
    "kind": "synthetic",
    "num_requests": 160,
    "arrivals": {"kind": "poisson", "rate": 2.7},
    "prompt": {"kind": "lognormal", "median": 120, "sigma": 0.6, "max": 600},
    "output": {"kind": "lognormal", "median": 48, "sigma": 0.5, "max": 160},
    "tenants": {"vip": 0.2, "default": 0.8},
    "seed": 7,
}


# ---------------------------------------------------------------------------------- part 1
def child_throughput(side: str, out: str) -> None:
    """One run in this process (vLLM's engine core here too): write tokens/s and per-step overhead to ``out``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from kvsched.executors.hf_models import model_folder
    from kvsched.executors.hf_prompts import benchmark_prompts
    from kvsched.integrations.vllm.steplog import read_step_log

    folder = model_folder("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    rng = random.Random(0)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
        for t in benchmark_prompts(64)
    ]
    prompts = [list(p if isinstance(p, list) else p["input_ids"]) for p in prompts]
    lengths = [rng.randint(32, 128) for _ in prompts]
    log = tempfile.mktemp(suffix=".jsonl")
    cls = (
        "kvsched.integrations.vllm.steplog.LoggingScheduler"
        if side == "vllm"
        else "kvsched.integrations.vllm.scheduler.KvschedScheduler"
    )
    kvsched = {"step_log": log, **({} if side == "vllm" else {"policy": "vllm-v1"})}
    llm = LLM(model=str(folder), scheduler_cls=cls, additional_config={"kvsched": kvsched}, **VLLM_ARGS)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    llm.generate([{"prompt_token_ids": p} for p in prompts[:4]], params[:4], use_tqdm=False)  # warm-up, not timed
    open(log, "w").close()
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    steps = read_step_log(log)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    overhead = [s["schedule_s"] + s["update_s"] for s in steps]
    Path(out).write_text(
        json.dumps(
            {
                "tokens": tokens,
                "prompt_tokens": sum(map(len, prompts)),
                "seconds": elapsed,
                "steps": len(steps),
                "sched_ms": 1000 * statistics.median(overhead),
            }
        )
    )


def run_side(side: str) -> dict:
    """One throughput run of ``side`` ("vllm": vLLM's own scheduler; "kvsched": ``vllm-v1`` through
    ``KvschedScheduler``) in a fresh process with one torch thread: tokens, seconds, steps, sched_ms."""
    out = tempfile.mktemp(suffix=".json")
    done = subprocess.run(
        [PY, __file__, "--child", side, out],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if done.returncode:
        raise SystemExit(
            f"the {side} throughput run failed ({done.returncode}):\n" + "\n".join(done.stderr.splitlines()[-20:])
        )
    return json.loads(Path(out).read_text())


def part_throughput(rounds: int) -> None:
    rows = {"vllm": [], "kvsched": []}
    for r in range(rounds):
        for side in ("vllm", "kvsched") if r % 2 == 0 else ("kvsched", "vllm"):
            result = run_side(side)
            rows[side].append(result)
            print(
                f"round {r + 1} {side:8s} {result['tokens'] / result['seconds']:7.1f} tok/s  "
                f"{result['steps']} steps, scheduler {result['sched_ms']:.3f} ms/step (median)",
                flush=True,
            )
    rate = {side: statistics.mean(x["tokens"] / x["seconds"] for x in runs) for side, runs in rows.items()}
    sched = {side: statistics.mean(x["sched_ms"] for x in runs) for side, runs in rows.items()}
    print(
        f"\noutput tokens/s: vLLM's scheduler {rate['vllm']:.1f}, kvsched vllm-v1 {rate['kvsched']:.1f}, "
        f"ratio {rate['kvsched'] / rate['vllm']:.3f}"
    )
    print(
        f"scheduler time per step: vLLM {sched['vllm']:.3f} ms, kvsched {sched['kvsched']:.3f} ms, "
        f"ratio {sched['kvsched'] / sched['vllm']:.2f}"
    )


# ---------------------------------------------------------------------------------- part 2
def case_figures(run_dir: Path) -> tuple[float, float, int]:
    """VIP and other requests' p99 TTFT, and how many requests reached the client in one burst
    (more than 5 tokens, every one within 50 ms: the machine stalled the server or the client,
    which inflates the TTFT of the requests it holds)."""
    import csv

    rows = [r for r in csv.DictReader((run_dir / "requests.csv").open()) if r["ttft"]]
    vip, other = (
        sorted(float(r["ttft"]) for r in rows if (r["tenant"] == "vip") == tenant_is_vip)
        for tenant_is_vip in (True, False)
    )
    burst = sum(
        1 for r in rows if r["e2e"] and int(r["output_tokens"]) > 5 and float(r["e2e"]) - float(r["ttft"]) < 0.05
    )
    return percentile(vip, 99), percentile(other, 99), burst


def case_traces(workdir: Path) -> dict[str, Path]:
    """The case-study workload as two plain traces with the same arrivals and lengths: one as sent
    to vLLM's fcfs and to ``priority-vip`` (every priority 0; VIPs are named by tenant), one as a
    user of vLLM's ``--scheduling-policy priority`` sends it (VIPs priority 0, the others 1)."""
    from kvsched.workloads import build_workload

    spec = workdir / "vip.json"
    spec.write_text(json.dumps(CASE_WORKLOAD))
    requests = list(build_workload(str(spec)).requests())
    traces = {}
    for name, vip_first in (("tenants", False), ("priorities", True)):
        path = traces[name] = workdir / f"vip-{name}.csv"
        lines = ["arrival_time_s,prompt_tokens,output_tokens,priority,tenant"]
        lines += [
            f"{r.arrival_time!r},{r.prompt_len},{r.output_len},{int(vip_first and r.tenant != 'vip')},{r.tenant}"
            for r in requests
        ]
        path.write_text("\n".join(lines) + "\n")
    return traces


CASE_SIDES = ("vllm-fcfs", "vllm-priority", "priority-vip")


def case_round(workdir: Path, name: str, r: int) -> dict:
    """One side's figures from round ``r``'s kept bench folder (``engine bench``'s requests.csv and summary.json)."""
    run_dir = workdir / f"{name}-{r}"
    vip, other, burst = case_figures(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "vip": vip,
        "other": other,
        "tput": summary["throughput_tokens_per_s"],
        "finished": summary["finished"],
        "burst": burst,
    }


def print_case_round(name: str, r: int, f: dict) -> None:
    print(
        f"round {r} {name:13s} VIP p99 TTFT {f['vip']:6.2f} s · others {f['other']:6.2f} s · {f['tput']:.1f} output "
        f"tok/s · {f['finished']} finished · {f['burst']} delivered in one burst",
        flush=True,
    )


def print_case_summary(results: dict[str, dict[int, dict]]) -> None:
    """priority-vip against each of vLLM's policies, and vLLM's priority against its fcfs: per-round
    ratios of VIP p99 TTFT, others' p99 TTFT and output throughput over the rounds both sides ran, their mean and
    range."""
    for side, base in (
        ("priority-vip", "vllm-fcfs"),
        ("priority-vip", "vllm-priority"),
        ("vllm-priority", "vllm-fcfs"),
    ):
        cells = []
        for key, label in (("vip", "VIP p99 TTFT"), ("other", "others' p99 TTFT"), ("tput", "output throughput")):
            both = sorted(results[side].keys() & results[base].keys())
            ratios = [results[side][r][key] / results[base][r][key] for r in both]
            cells.append(f"{label} {statistics.mean(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
        print(f"{side} / {base}: " + ", ".join(cells) + f" (mean and range of rounds {', '.join(map(str, both))})")


def part_case_study(workdir: Path, rounds: int, run: bool = True) -> None:
    """Run the three sides for ``rounds`` alternating rounds (or, without ``run``, summarize the rounds kept in
    ``workdir``, skipping those that are not there)."""
    traces = case_traces(workdir) if run else {}
    flags = ["--max-model-len", "2048", "--max-num-seqs", "8", "--max-num-batched-tokens", "512"]  # requests queue
    sides = {  # name: (server command, the trace it is sent)
        "vllm-fcfs": (lambda port: servers.vllm_command(port, flags), "tenants"),
        "vllm-priority": (
            lambda port: servers.vllm_command(port, [*flags, "--scheduling-policy", "priority"]),
            "priorities",
        ),
        "priority-vip": (
            lambda port: [
                str(servers.ENGINE),
                "serve",
                "--policy",
                "priority-vip",
                "--policy-opt",
                f"aging_s={AGING_S}",
                "--port",
                str(port),
                "--",
                *flags,
            ],
            "tenants",
        ),
    }
    results: dict[str, dict[int, dict]] = {name: {} for name in CASE_SIDES}  # side: round: figures
    for r in range(1, rounds + 1):
        for name in CASE_SIDES if r % 2 else CASE_SIDES[::-1]:
            if run:
                command, trace = sides[name]
                port = servers.free_port()
                proc = servers.start(command(port), port)
                try:
                    servers.bench(port, name, traces[trace], workdir / f"{name}-{r}", trace=True)
                finally:
                    servers.stop(proc)
            elif not (workdir / f"{name}-{r}").is_dir():
                print(f"round {r} {name:13s} not in {workdir}")
                continue
            results[name][r] = case_round(workdir, name, r)
            print_case_round(name, r, results[name][r])
    print_case_summary(results)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_throughput(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("throughput", "case-study", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="keep the bench result folders here")
    parser.add_argument(
        "--summarize",
        action="store_true",
        help="with --part case-study: print the figures of the rounds kept in --workdir, run nothing",
    )
    args = parser.parse_args()
    if args.summarize and (args.part != "case-study" or args.workdir is None):
        parser.error("--summarize needs --part case-study and the --workdir of an earlier run")
    if args.part in ("throughput", "both"):
        part_throughput(args.rounds)
    if args.part in ("case-study", "both"):
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvsched-case-"))
        workdir.mkdir(parents=True, exist_ok=True)
        part_case_study(workdir, args.rounds, run=not args.summarize)


if __name__ == "__main__":
    main()
