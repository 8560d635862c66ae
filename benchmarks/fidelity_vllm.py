"""The simulator against real vLLM: fit a cost profile to vLLM's measured steps, then predict other workloads.

1. Calibration: a workload is served by real vLLM (its own V1 scheduler, SmolLM2-135M, fp32, one
   CPU thread) with the step log on (``integrations/vllm/steplog.py``); each step's features
   (prefill tokens, decoding sequences, KV tokens attended) and its duration (from one
   ``schedule()`` to the next while busy) are fitted to ``t = a + b·P + c·D + d·K``.
2. Held out: two other workloads (other prompt and output lengths, Poisson arrivals), one light
   and one with queueing and preemption (a smaller KV cache), are served for real and timed by
   ``engine bench``; the same requests are simulated with ``vllm-v1`` and the fitted profile.
3. Prints, same run, the error of the mean, p50 and p90 of TTFT, TPOT and E2E (target: within 10%
   on means, 15% on p90), and writes the fitted profile as JSON.

    .venv/bin/python benchmarks/fidelity_vllm.py --profile-out /tmp/smollm2-135m-vllm-cpu.json   # ~12 min here
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import vllm_servers as servers

BLOCKS = {"calibration": 400, "light": 400, "heavy": 60}  # KV blocks of 32 tokens (the heavy run preempts)
FLAGS = ["--max-model-len", "1024", "--max-num-seqs", "32", "--max-num-batched-tokens", "512"]
WORKLOADS = {
    # Calibration spans small and large batches and prompts: a burst, then a trickle.
    "calibration": {
        "kind": "synthetic",
        "num_requests": 80,
        "arrivals": {"kind": "gamma", "rate": 3.0, "cv": 2.0},
        "prompt": {"kind": "lognormal", "median": 150, "sigma": 0.8, "max": 700},
        "output": {"kind": "lognormal", "median": 60, "sigma": 0.7, "max": 250},
        "seed": 1,
    },
    "light": {
        "kind": "synthetic",
        "num_requests": 50,
        "arrivals": {"kind": "poisson", "rate": 0.8},
        "prompt": {"kind": "lognormal", "median": 90, "sigma": 0.5, "max": 400},
        "output": {"kind": "lognormal", "median": 40, "sigma": 0.5, "max": 150},
        "seed": 2,
    },
    "heavy": {
        "kind": "synthetic",
        "num_requests": 70,
        "arrivals": {"kind": "poisson", "rate": 2.5},
        "prompt": {"kind": "lognormal", "median": 220, "sigma": 0.6, "max": 700},
        "output": {"kind": "lognormal", "median": 80, "sigma": 0.6, "max": 250},
        "seed": 3,
    },
}
METRICS = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))
BUSY_GAP_S = 0.005  # a step that starts this soon after the previous one's update was waiting for nothing


def step_records(log: list[dict]):
    """The step log as calibration records: each busy step's features and its duration."""
    from kvsched.core.outputs import causal_pairs
    from kvsched.executors.calibration import StepRecord

    records = []
    for this, after in zip(log, log[1:]):
        if not this["scheduled"]:
            continue
        done = this["t_update"] + this["update_s"]
        end = after["t_schedule"] if after["t_schedule"] - done < BUSY_GAP_S else done
        prefill = decode = kv = pairs = 0
        for rid, n in this["scheduled"].items():
            computed = this["computed"][rid]
            kv += computed
            pairs += causal_pairs(computed, n) if n > 1 else 0
            if n == 1 and computed > 0:
                decode += 1
            else:
                prefill += n
        records.append(StepRecord(prefill, decode, kv, 0, 0, end - this["t_schedule"], pairs))
    return records


def serve_and_bench(name: str, workdir: Path) -> tuple[dict, list[dict]]:
    """Serve workload ``name`` with real vLLM (its own scheduler, the step log on); the bench summary and the log."""
    from kvsched.integrations.vllm.steplog import read_step_log

    spec = workdir / f"{name}.json"
    spec.write_text(json.dumps(WORKLOADS[name]))
    log = workdir / f"{name}-steps.jsonl"
    log.unlink(missing_ok=True)
    flags = [*FLAGS, "--num-gpu-blocks-override", str(BLOCKS[name])]
    port = servers.free_port()
    proc = servers.start(
        servers.vllm_command(port, flags, "kvsched.integrations.vllm.steplog.LoggingScheduler", {"step_log": str(log)}),
        port,
    )
    try:
        servers.warm_up(port)
        warm_steps = len(read_step_log(str(log)))  # the warm-up's steps are not the workload's
        summary = servers.bench(port, name, spec, workdir / name, warm=False)
    finally:
        servers.stop(proc)
    return summary, read_step_log(str(log))[warm_steps:]


def simulate(name: str, workdir: Path, profile) -> dict:
    return simulate_run(workdir / f"{name}.json", BLOCKS[name], profile).summary


def simulate_run(spec: Path, blocks: int, profile, policy: str = "vllm-v1"):
    """The workload ``spec`` simulated by ``policy`` on vLLM's settings of these runs (``FLAGS``, ``blocks`` KV
    blocks)."""
    from kvsched.core.config import EngineConfig
    from kvsched.experiments.simulation import SimJob
    from kvsched.workloads import build_workload

    # vLLM's own settings for these runs; V1 caches prefixes by default, so a preempted request finds
    # its own blocks again (without it, the heavy run's recomputes cost a fifth more than vLLM's).
    config = EngineConfig(
        vllm_engine="v1",
        block_size=32,
        num_gpu_blocks=blocks,
        num_cpu_blocks=0,
        watermark=0.0,
        max_model_len=1024,
        max_num_seqs=32,
        max_num_batched_tokens=512,
        enable_prefix_caching=True,
    )
    return SimJob(build_workload(str(spec)), policy, config, profile, record_timeseries=False).run().result


def error(predicted: float | None, measured: float | None) -> str:
    if predicted is None or measured is None or measured == 0:
        return "   -  "
    return f"{100 * (predicted - measured) / measured:+6.1f}%"


def calibrate(workdir: Path):
    """Serve the calibration workload with vLLM's own scheduler and fit the cost profile to its steps."""
    from kvsched.executors.calibration import fit_errors, fit_profile
    from kvsched.executors.cost_model import SMOLLM2_KV_BYTES_PER_TOKEN

    workdir.mkdir(parents=True, exist_ok=True)
    _, steps = serve_and_bench("calibration", workdir)
    records = step_records(steps)
    profile = fit_profile(
        records,
        name="smollm2-135m-vllm-cpu",
        description=(
            f"SmolLM2-135M-Instruct (fp32) served by vLLM 0.32 (vllm-cpu) on one CPU thread of the project machine: "
            f"fitted by benchmarks/fidelity_vllm.py to {len(records)} measured steps"
        ),
        kv_bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN,
    )
    errors = fit_errors(profile, records)
    print(
        f"fitted to {len(records)} steps: a={profile.base_ms:.2f} ms, b={profile.prefill_token_ms:.4f} ms/prefill "
        f"token, c={profile.decode_seq_ms:.3f} ms/decode, d={profile.kv_token_ms:.2e} ms/KV token; mean step error "
        f"{100 * errors['mape']:.1f}%",
        flush=True,
    )
    return profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile-out", type=Path, help="write the fitted profile here (JSON)")
    parser.add_argument("--workdir", type=Path, help="keep the step log and the result folders here")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kvsched-fidelity-"))
    profile = calibrate(workdir)
    if args.profile_out:
        args.profile_out.parent.mkdir(parents=True, exist_ok=True)
        args.profile_out.write_text(profile.model_dump_json(indent=2) + "\n")
    print("\n| workload | metric | measured mean / p50 / p90 | predicted mean / p50 / p90 | error mean / p50 / p90 |")
    print("|---|---|---|---|---|")
    for name in ("light", "heavy"):
        (measured, steps), predicted = serve_and_bench(name, workdir), simulate(name, workdir, profile)
        for label, key in METRICS:
            m, p = measured[key], predicted[key]
            cells = [
                " / ".join(f"{d[q]:.3f}" if d[q] is not None else "-" for q in ("mean", "p50", "p90")) for d in (m, p)
            ]
            errs = " / ".join(error(p[q], m[q]) for q in ("mean", "p50", "p90"))
            print(f"| {name} | {label} (s) | {cells[0]} | {cells[1]} | {errs} |", flush=True)
        real_preemptions = sum(len(s["preempted"]) for s in steps)
        print(
            f"| {name} | steps, preemptions | {len(steps)}, {real_preemptions} | {predicted['steps']}, "
            f"{predicted['preemptions']['recompute']} | |",
            flush=True,
        )


if __name__ == "__main__":
    main()
