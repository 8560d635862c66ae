"""Triton paged decode attention against the memory-bandwidth floor (GPU only).

A decode step must read every cached K and V byte of every sequence once; at the device's peak
bandwidth that takes ``bytes / peak``. This times the Triton kernel (CUDA events, median of
``--iters``) for a few batch/context shapes, without and with split-KV (``splits`` 1, then the
automatic choice, and any ``--splits`` given), and prints achieved GB/s and the fraction of peak.

    python benchmarks/attention_bandwidth.py --peak-gbs 4800      # H200 HBM3e
"""

from __future__ import annotations

import argparse
import statistics

import torch

from kvsched.kernels import paged_attention_torch
from kvsched.kernels.triton_attention import choose_num_splits, paged_attention_triton


def problem(batch, context, heads, kv_heads, head_dim, block_size, dtype, device):
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    g = torch.Generator(device="cpu").manual_seed(0)
    tables = torch.randperm(num_blocks, generator=g).view(batch, blocks_per_seq).to(device=device, dtype=torch.int32)
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    q = torch.randn(batch, heads, head_dim, device=device, dtype=dtype)
    cu = torch.arange(batch + 1, device=device, dtype=torch.int32)
    lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    return q, k, v, cu, lens, tables, head_dim**-0.5


def time_ms(fn, iters):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="device peak memory bandwidth, GB/s")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--splits", type=int, nargs="*", default=[], help="also time these forced split-KV counts")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a CUDA device"
    heads, kv_heads, head_dim, block_size = 32, 8, 128, 16  # a Llama-3-8B-like layer
    print(
        f"device: {torch.cuda.get_device_name()}; layer H={heads} KVH={kv_heads} D={head_dim}, block {block_size}, one "
        "layer per call"
    )
    print(
        f"{'dtype':<6}{'batch':>6}{'context':>8}{'tile':>6}{'splits':>7}{'KV MB':>9}{'time us':>10}{'floor us':>10}"
        f"{'GB/s':>9}{'% peak':>8}{'max err':>10}"
    )
    for dtype in (torch.bfloat16, torch.float32):
        for batch, context in ((8, 1024), (32, 2048), (128, 1024), (64, 8192)):
            prob = problem(batch, context, heads, kv_heads, head_dim, block_size, dtype, "cuda")
            ref = paged_attention_torch(*prob).float()
            nbytes = 2 * batch * context * kv_heads * head_dim * prob[1].element_size()
            for tile in (16, 64):
                auto = choose_num_splits(batch * kv_heads, prob[5].shape[1] * block_size, tile, prob[0].device)
                for splits in sorted({1, auto, *args.splits}):
                    fn = lambda: paged_attention_triton(  # noqa: E731
                        *prob, max_query_len=1, tile_n=tile, ieee=dtype == torch.float32, num_splits=splits
                    )
                    err = float((fn().float() - ref).abs().max())
                    ms = time_ms(fn, args.iters)
                    gbs = nbytes / (ms * 1e-3) / 1e9
                    floor_us = nbytes / (args.peak_gbs * 1e9) * 1e6
                    name = str(dtype).removeprefix("torch.")
                    print(
                        f"{name:<6}{batch:>6}{context:>8}{tile:>6}{splits:>7}{nbytes / 1e6:>9.1f}{ms * 1e3:>10.1f}"
                        f"{floor_us:>10.1f}{gbs:>9.0f}{100 * gbs / args.peak_gbs:>7.1f}%{err:>10.1e}"
                    )


if __name__ == "__main__":
    main()
