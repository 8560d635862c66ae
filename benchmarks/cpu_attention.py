"""CPU decode attention: the torch backend against its previous (padded SDPA) version, one thread.

A decode step of the real executor calls the attention once per layer with the same metadata. This
builds SmolLM2-135M-shaped decode batches (9 query heads, 3 KV heads, head dim 64, fp32, block 16)
on a 30-layer ``PagedKVCache`` with shuffled block tables, and times one 30-layer step (a different
layer's K/V pool per call, so the K/V reads come from memory as in the real model) of

* ``baseline``: the previous ``paged_attention_torch`` decode path, copied below unchanged: K/V of
  every sequence gathered and padded to the longest one, one masked SDPA call with ``enable_gqa``;
* ``current``: ``kvsched.kernels.paged_attention_torch``.

Every timed step changes the sequence lengths, so anything the backend caches per step is rebuilt
once per step, as in the executor. It prints ms per step (best of ``--steps``), the ratio, and the
max abs difference of both against the loop oracle (``kernels/reference.py``) on one layer.

    .venv/bin/python benchmarks/cpu_attention.py            # about half a minute
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from kvsched.kernels import PagedKVCache, paged_attention_loop, paged_attention_torch

HEADS, KV_HEADS, HEAD_DIM, BLOCK, LAYERS = 9, 3, 64, 16, 30  # SmolLM2-135M
CASES = (  # (batch, shortest context, longest context)
    (64, 60, 320),
    (16, 60, 320),
    (64, 20, 80),
)


# ---- BASELINE: paged_attention_torch as it was before the pair/segmented-softmax decode path ----
def baseline_paged_attention_torch(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_tables, scale):
    num_heads = q.shape[1]
    block_size = k_cache.shape[1]
    gqa = num_heads != k_cache.shape[2]
    out = torch.empty_like(q)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    tables = block_tables.to(device=k_cache.device, dtype=torch.long)
    q_lens = [cu[i + 1] - cu[i] for i in range(len(lens))]

    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        rows = torch.tensor([cu[i] for i in decode], device=q.device)
        dlens = torch.tensor([lens[i] for i in decode], device=q.device)
        nblocks = -(-max(lens[i] for i in decode) // block_size)
        idx = tables[decode][:, :nblocks] if len(decode) < len(lens) else tables[:, :nblocks]
        keys = k_cache[idx].flatten(1, 2).transpose(1, 2)  # [B, KVH, S, D], a view of the gathered copy
        values = v_cache[idx].flatten(1, 2).transpose(1, 2)
        valid = torch.arange(nblocks * block_size, device=q.device)[None, :] < dlens[:, None]  # [B, S]
        o = F.scaled_dot_product_attention(
            q[rows].unsqueeze(2).to(keys.dtype),
            keys,
            values,
            attn_mask=valid[:, None, None, :],
            scale=scale,
            enable_gqa=gqa,
        )
        out[rows] = o.squeeze(2).to(q.dtype)

    for i, n in enumerate(q_lens):
        if n <= 1:
            continue
        seq_len = lens[i]
        blocks = tables[i, : -(-seq_len // block_size)]
        keys = k_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)  # [1, KVH, S, D]
        values = v_cache[blocks].flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)
        qs = q[cu[i] : cu[i + 1]].transpose(0, 1).unsqueeze(0).to(keys.dtype)  # [1, H, n, D]
        if n == seq_len:
            o = F.scaled_dot_product_attention(qs, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            positions = torch.arange(seq_len - n, seq_len, device=q.device)
            causal = torch.arange(seq_len, device=q.device)[None, :] <= positions[:, None]
            o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=causal, scale=scale, enable_gqa=gqa)
        out[cu[i] : cu[i + 1]] = o[0].transpose(0, 1).to(q.dtype)
    return out


# ---- end of BASELINE ----


def decode_batch(batch, lo, hi, seed=0):
    """A 30-layer cache holding ``batch`` sequences of ``lo..hi`` tokens in shuffled blocks, and their queries."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (batch,), generator=g)
    nblocks = [-(-int(n) // BLOCK) for n in lens]
    num_blocks = sum(nblocks) + 64
    cache = PagedKVCache(LAYERS, num_blocks, 1, BLOCK, KV_HEADS, HEAD_DIM)
    cache.gpu.normal_(generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.zeros(batch, max(nblocks), dtype=torch.int32)
    for i, n in enumerate(nblocks):
        tables[i, :n] = torch.tensor(perm[:n])
        del perm[:n]
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=g)
    cu = torch.arange(batch + 1, dtype=torch.int32)
    return cache, q, cu, lens.to(torch.int32), tables


def time_steps(attends, cache, q, cu, lens, tables, steps):
    """Best wall time (ms) of one 30-layer decode step for each function, their steps interleaved.

    The lengths alternate from step to step (same blocks), so each step brings new metadata.
    """
    variants = [lens, (lens - 1).clamp(min=1)]
    best = [float("inf")] * len(attends)
    for step in range(steps + 1):  # the first one warms up
        for j, attend in enumerate(attends):
            meta = (cu.clone(), variants[step % 2].clone(), tables.clone())
            start = time.perf_counter()
            for layer in range(LAYERS):
                attend(q, cache.key(layer), cache.value(layer), *meta, HEAD_DIM**-0.5)
            if step:
                best[j] = min(best[j], (time.perf_counter() - start) * 1e3)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per case and implementation (best is kept)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--no-oracle", action="store_true", help="skip the (slow-ish) loop-oracle error check")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {torch.backends.cpu.get_cpu_capability()}; "
        f"H={HEADS} KVH={KV_HEADS} D={HEAD_DIM} fp32, block {BLOCK}, {LAYERS} layers per step"
    )
    print(
        f"{'batch':>5} {'context':>8} {'KV MB/step':>10} {'baseline ms':>12} {'current ms':>11} {'ratio':>6}"
        f" {'base err':>9} {'cur err':>9}"
    )
    for batch, lo, hi in CASES:
        cache, q, cu, lens, tables = decode_batch(batch, lo, hi)
        kv_mb = 2 * int(lens.sum()) * KV_HEADS * HEAD_DIM * 4 * LAYERS / 1e6
        base, cur = time_steps(
            (baseline_paged_attention_torch, paged_attention_torch), cache, q, cu, lens, tables, args.steps
        )
        errs = ("", "")
        if not args.no_oracle:
            problem = (q, cache.key(0), cache.value(0), cu, lens, tables, HEAD_DIM**-0.5)
            want = paged_attention_loop(*problem)
            errs = tuple(
                f"{float((f(*problem) - want).abs().max()):.1e}"
                for f in (baseline_paged_attention_torch, paged_attention_torch)
            )
        print(
            f"{batch:>5} {f'{lo}-{hi}':>8} {kv_mb:>10.0f} {base:>12.1f} {cur:>11.1f} {base / cur:>5.1f}x {errs[0]:>9} "
            f"{errs[1]:>9}"
        )


if __name__ == "__main__":
    main()
