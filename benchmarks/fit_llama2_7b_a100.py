"""Reproduce the built-in ``llama2-7b-a100`` cost profile from Vidur's per-operator profiles.

1. Linear layers: sum the median times of the per-layer token-wise operators in ``mlp.csv``
   (TP 1) and interpolate in the number of tokens in the step (prefill tokens + decodes).
2. Attention: fit Vidur's decode and prefill attention samples by relative least squares:
   decode ``e0 + e1·bs + e2·Σkv``, prefill ``f0 + f1·c + f2·c·kv + f3·c²`` (per layer).
3. Reference step time = 32 layers × (linear + attention), no CPU overhead (Vidur's default).
4. The attention term ``e`` (ms per query-key pair of a prefill chunk) is the prefill fit's slope in
   chunk × KV (``f2``, what each cached token adds per chunk token) times 32 layers: Vidur's timings by
   chunk and KV size measure it directly, where a fit of whole steps up to 4,096 tokens cannot
   separate it from the per-token and per-KV-token terms (it would take about half of it).
5. Draw 3,700 steps (1,500 decode-only, 700 prefill-only, 1,500 Sarathi-like mixed), compute
   their reference times and their features (P, D, K, E), and fit ``a + b·P + c·D + d·K`` to
   each step's time less ``e·E`` with the same non-negative relative least squares that
   ``engine calibrate`` uses.

Run: ``.venv/bin/python benchmarks/fit_llama2_7b_a100.py [--json out.json]``.
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "calibration"
LAYERS = 32
LINEAR_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


def linear_table(path: Path = DATA / "vidur_a100_llama2_7b_mlp.csv") -> tuple[list[int], list[float]]:
    """(num_tokens, ms per layer) for TP 1, sorted."""
    rows = []
    with path.open() as f:
        for r in csv.DictReader(f):
            if int(r["num_tensor_parallel_workers"]) == 1:
                rows.append((int(r["num_tokens"]), sum(float(r[f"time_stats.{op}.median"]) for op in LINEAR_OPS)))
    by_tokens: dict[int, list[float]] = {}
    for n, t in rows:
        by_tokens.setdefault(n, []).append(t)  # a few token counts were profiled twice: average them
    xs = sorted(by_tokens)
    return xs, [sum(by_tokens[n]) / len(by_tokens[n]) for n in xs]


def interp(x: float, xs: list[int], ys: list[float]) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (x - xs[-1])
    lo, hi = 0, len(xs) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xs[mid] <= x:
            lo = mid
        else:
            hi = mid
    return ys[lo] + (ys[hi] - ys[lo]) * (x - xs[lo]) / (xs[hi] - xs[lo])


def relative_lstsq(rows: list[list[float]], targets: list[float]) -> list[float]:
    """Unconstrained least squares on relative error (numpy)."""
    import numpy as np

    a = np.asarray(rows, dtype=float) / np.asarray(targets, dtype=float)[:, None]
    coef, *_ = np.linalg.lstsq(a, np.ones(len(targets)), rcond=None)
    return [float(c) for c in coef]


def attention_models(path: Path = DATA / "vidur_a100_llama2_7b_attention_sampled.csv"):
    decode_x, decode_t, prefill_x, prefill_t = [], [], [], []
    with path.open() as f:
        for r in csv.DictReader(f):
            bs, c, kv, t = int(r["batch_size"]), int(r["prefill_chunk_size"]), int(r["kv_cache_size"]), float(r["t_ms"])
            if r["kind"] == "decode":
                decode_x.append([1.0, bs, bs * kv])
                decode_t.append(t)
            else:
                prefill_x.append([1.0, c, c * kv, c * c])
                prefill_t.append(t)
    dec, pre = relative_lstsq(decode_x, decode_t), relative_lstsq(prefill_x, prefill_t)

    def mape(coef, xs, ts):
        return sum(abs(sum(c * x for c, x in zip(coef, row)) - t) / t for row, t in zip(xs, ts)) / len(ts)

    return dec, pre, mape(dec, decode_x, decode_t), mape(pre, prefill_x, prefill_t), len(decode_t), len(prefill_t)


def reference_step_ms(prefills: list[tuple[int, int]], decode_kvs: list[int], lin, dec, pre) -> float:
    """Vidur-style step time; ``prefills`` as (chunk, cached prefix), ``decode_kvs`` the decode contexts."""
    tokens = sum(c for c, _ in prefills) + len(decode_kvs)
    per_layer = interp(tokens, *lin)
    if decode_kvs:
        per_layer += dec[0] + dec[1] * len(decode_kvs) + dec[2] * sum(decode_kvs)
    for c, kv in prefills:
        per_layer += pre[0] + pre[1] * c + pre[2] * c * kv + pre[3] * c * c
    return LAYERS * per_layer


def pairs_of(prefills: list[tuple[int, int]]) -> int:
    """The step's prefill query-key pairs (``StepFeatures.prefill_pairs``: chunks of two or more tokens)."""
    from kvsched.core.outputs import causal_pairs

    return sum(causal_pairs(kv, c) for c, kv in prefills if c > 1)


def synthetic_steps(seed: int = 0):
    """(kind, prefills, decode contexts) for the 3,700 reference steps."""
    rng = random.Random(seed)
    steps = []
    for _ in range(1500):
        bs = int(math.exp(rng.uniform(0, math.log(256))))
        steps.append(("decode", [], [rng.randrange(16, 4000) for _ in range(max(1, min(255, bs)))]))
    for _ in range(700):
        k = rng.randint(1, 4)
        total = rng.randint(k, 4096)
        cuts = sorted(rng.sample(range(1, total), k - 1)) if k > 1 else []
        lens = [b - a for a, b in zip([0] + cuts, cuts + [total])]
        steps.append(("prefill", [(n, 0) for n in lens], []))
    for _ in range(1500):
        chunk, prefix = rng.randint(32, 512), rng.randint(0, 3500)
        steps.append(("mixed", [(chunk, prefix)], [rng.randrange(16, 4000) for _ in range(rng.randint(1, 128))]))
    return steps


def main(argv: list[str] | None = None) -> dict:
    from kvsched.executors.calibration import StepRecord, fit_errors, fit_profile
    from kvsched.executors.cost_model import LLAMA2_7B_A100

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the fitted profile here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    lin = linear_table()
    dec, pre, dec_err, pre_err, n_dec, n_pre = attention_models()
    print(
        f"attention decode  (per layer, ms) = {dec[0]:.5f} + {dec[1]:.5f}·bs + {dec[2]:.3g}·Σkv   MAPE "
        f"{100 * dec_err:.1f}% (n={n_dec})"
    )
    print(
        f"attention prefill (per layer, ms) = {pre[0]:.4f} + {pre[1]:.3g}·c + {pre[2]:.3g}·c·kv + {pre[3]:.3g}·c²   "
        f"MAPE {100 * pre_err:.1f}% (n={n_pre})"
    )
    print(
        f"linear layers, 32 layers: 1 token {LAYERS * interp(1, *lin):.1f} ms, 512 tokens "
        f"{LAYERS * interp(512, *lin):.1f} ms, 4096 tokens {LAYERS * interp(4096, *lin):.0f} ms"
    )

    pair_ms = LAYERS * pre[2]
    print(f"attention pairs: e = 32 layers × {pre[2]:.3g} = {pair_ms:.3g} ms per query-key pair")
    records, rest, kinds = [], [], []
    for kind, prefills, decodes in synthetic_steps(args.seed):
        t = reference_step_ms(prefills, decodes, lin, dec, pre)
        pairs = pairs_of(prefills)
        features = (sum(c for c, _ in prefills), len(decodes), sum(decodes) + sum(kv for _, kv in prefills), 0, 0)
        records.append(StepRecord(*features, t / 1000, pairs))
        rest.append(StepRecord(*features, (t - pair_ms * pairs) / 1000))
        kinds.append(kind)
    base = LLAMA2_7B_A100
    fitted = fit_profile(
        rest,
        "llama2-7b-a100-refit",
        kv_bytes_per_token=base.kv_bytes_per_token,
        swap_gb_per_s=base.swap_gb_per_s,
        copy_gb_per_s=base.copy_gb_per_s,
        description="Llama-2-7B / A100, refitted by benchmarks/fit_llama2_7b_a100.py",
    )
    fitted = fitted.model_copy(update={"attention_pair_ms": pair_ms})
    result = {"fitted": fitted, "overall": fit_errors(fitted, records), "builtin": fit_errors(base, records)}
    for kind in ("decode", "prefill", "mixed"):
        subset = [r for r, k in zip(records, kinds) if k == kind]
        result[kind] = fit_errors(fitted, subset)
    print()
    print("| coefficient | refit | built-in llama2-7b-a100 |")
    print("|---|---|---|")
    for field, label in (
        ("base_ms", "a (ms/step)"),
        ("prefill_token_ms", "b (ms/prefill token)"),
        ("decode_seq_ms", "c (ms/decode seq)"),
        ("kv_token_ms", "d (ms/KV token)"),
        ("attention_pair_ms", "e (ms/prefill pair)"),
    ):
        print(f"| {label} | {getattr(fitted, field):.4g} | {getattr(base, field):.4g} |")
    o = result["overall"]
    print(
        f"\nrefit on {o['n']} steps: mean error {100 * o['mape']:.2f}% (decode {100 * result['decode']['mape']:.1f}%, "
        f"mixed {100 * result['mixed']['mape']:.1f}%, prefill {100 * result['prefill']['mape']:.1f}%), "
        f"p95 {100 * o['p95']:.1f}%, max {100 * o['max']:.1f}%"
    )
    print(
        f"built-in profile on the same steps: mean error {100 * result['builtin']['mape']:.2f}%, p95 "
        f"{100 * result['builtin']['p95']:.1f}%"
    )
    print(
        "\none prompt's prefill alone in 512-token chunks (past 4,096 tokens the reference extrapolates Vidur's fits):"
    )
    for prompt in (4096, 32768, 131072):
        chunks = [(512, start) for start in range(0, prompt, 512)]
        reference = sum(reference_step_ms([chunk], [], lin, dec, pre) for chunk in chunks) / 1000
        refit = sum(fitted.seconds(512, 0, start, 0, 0, 16, pairs_of([(512, start)])) for _, start in chunks)
        builtin = sum(base.seconds(512, 0, start, 0, 0, 16, pairs_of([(512, start)])) for _, start in chunks)
        print(f"  {prompt:>7,} tokens: reference {reference:6.2f} s, refit {refit:6.2f} s, built-in {builtin:6.2f} s")
    if args.json:
        args.json.write_text(fitted.model_dump_json(indent=2) + "\n")
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
