"""The vectorised torch backend against the loop oracle, block ops bit-exact, backend choice."""

from __future__ import annotations

import pytest
import torch

from kvsched.kernels import (
    PagedKVCache,
    choose_backend,
    copy_blocks,
    paged_attention_loop,
    paged_attention_torch,
    reshape_and_cache,
    swap_blocks,
)
from tests.kernel_cases import MIXED, make_problem, tolerance

HEADS = [(4, 4), (4, 2), (6, 1), (9, 3)]  # MHA, GQA, MQA, SmolLM2's 3:1 with a non power-of-two group


@pytest.mark.parametrize("head_dim", [16, 24, 64])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}KV{h[1]}")
@pytest.mark.parametrize("block_size", [4, 5, 16])
def test_torch_matches_loop_fp32(head_dim, heads, block_size):
    problem = make_problem(MIXED, *heads, head_dim, block_size, seed=head_dim + block_size)
    want = paged_attention_loop(*problem)
    got = paged_attention_torch(*problem)
    torch.testing.assert_close(got, want, **tolerance(torch.float32))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_matches_loop_half(dtype):
    problem = make_problem(MIXED, 8, 2, 64, 16, dtype=dtype, seed=3)
    torch.testing.assert_close(paged_attention_torch(*problem), paged_attention_loop(*problem), **tolerance(dtype))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU run of the torch backend (benchmarks/gpu_check.sh)")
def test_torch_backend_on_cuda():
    problem = make_problem(MIXED, 8, 2, 64, 16, seed=4, device="cuda")
    want = paged_attention_loop(*(t.cpu() if isinstance(t, torch.Tensor) else t for t in problem))
    torch.testing.assert_close(paged_attention_torch(*problem).cpu(), want, **tolerance(torch.float32))


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}KV{h[1]}")
def test_torch_pure_decode_batch_and_step_plan_reuse(heads):
    """A decode-only batch (the fast path returns its rows directly), called again as the next layer of
    the same step, then with other lengths/tables in tensors mutated in place: no stale cached plan."""
    cases = [(1, n) for n in (1, 15, 16, 17, 40, 64, 3, 33)]
    problem = list(make_problem(cases, *heads, 64, 16, seed=7))
    want = paged_attention_loop(*problem)
    torch.testing.assert_close(paged_attention_torch(*problem), want, **tolerance(torch.float32))
    torch.testing.assert_close(paged_attention_torch(*problem), want, **tolerance(torch.float32))
    problem[4][:] = torch.tensor([2, 14, 16, 20, 33, 49, 1, 30], dtype=torch.int32)
    problem[5][:] = problem[5].flip(0)
    torch.testing.assert_close(
        paged_attention_torch(*problem), paged_attention_loop(*problem), **tolerance(torch.float32)
    )


def test_torch_step_plan_is_keyed_on_the_query_rows_too():
    """Same metadata, a query with extra (padding) rows: the cached plan must not shrink the output."""
    problem = list(make_problem([(1, 5), (1, 9)], 4, 2, 16, 4, seed=3))
    paged_attention_torch(*problem)
    padded = torch.cat([problem[0], torch.zeros_like(problem[0])])
    out = paged_attention_torch(padded, *problem[1:])
    assert out.shape == padded.shape
    torch.testing.assert_close(out[:2], paged_attention_loop(*problem), **tolerance(torch.float32))


def test_torch_backend_is_inference_only():
    problem = list(make_problem([(1, 5)], 4, 2, 16, 4, seed=3))
    problem[0] = problem[0].clone().requires_grad_()
    with pytest.raises(RuntimeError, match="inference-only"):
        paged_attention_torch(*problem)
    with torch.no_grad():
        paged_attention_torch(*problem)


def test_loop_reference_is_causal_softmax():
    """The oracle itself against a dense causal attention of one contiguous sequence."""
    q, k_cache, v_cache, cu, lens, tables, scale = make_problem([(6, 6)], 2, 2, 16, 4, seed=1)
    keys = k_cache[tables[0].long()].flatten(0, 1)[:6]
    values = v_cache[tables[0].long()].flatten(0, 1)[:6]
    dense = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), is_causal=True, scale=scale
    ).transpose(0, 1)
    torch.testing.assert_close(
        paged_attention_loop(q, k_cache, v_cache, cu, lens, tables, scale), dense, atol=1e-5, rtol=1e-5
    )


def test_attention_reads_only_its_own_blocks():
    """Garbage in blocks no table names must not change any output (masked loads, no stray reads)."""
    problem = list(make_problem(MIXED, 4, 2, 16, 4, seed=2))
    before = paged_attention_torch(*problem)
    named = set(problem[5].flatten().tolist())
    for b in range(problem[1].shape[0]):
        if b not in named:
            problem[1][b] = float("nan")
            problem[2][b] = float("nan")
    torch.testing.assert_close(paged_attention_torch(*problem), before, atol=0, rtol=0)


def test_reshape_and_cache_writes_slots_and_skips_minus_one():
    k_cache = torch.zeros(4, 3, 2, 8)
    v_cache = torch.zeros(4, 3, 2, 8)
    key, value = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([0, 7, -1, 11, 5])
    reshape_and_cache(key, value, k_cache, v_cache, slots)
    want_k, want_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            want_k[s // 3, s % 3], want_v[s // 3, s % 3] = key[t], value[t]
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_reshape_and_cache_on_a_non_contiguous_layer_view():
    pool = torch.zeros(2, 3, 4, 2, 2, 8)  # [K/V, layers, blocks, block_size, heads, dim]
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    k_view = pool[0].select(1, 1)  # a strided [3 "blocks", 2, 2, 8] view: rows of blocks are not adjacent
    assert not k_view.is_contiguous()
    v_view = pool[1].select(1, 1)
    reshape_and_cache(key, value, k_view, v_view, torch.tensor([1, 4, 5]))
    assert torch.equal(pool[0, 0, 1, 1], key[0]) and torch.equal(pool[0, 2, 1, 0], key[1])
    assert torch.equal(pool[1, 2, 1, 1], value[2])
    assert int((pool != 0).sum()) == 3 * 2 * 2 * 8


def test_copy_blocks_is_exact_and_order_free():
    cache = torch.randn(6, 4, 2, 8)
    before = cache.clone()
    copy_blocks(cache, [(0, 3), (3, 5), (1, 2)])  # 3 is a destination and a source: sources read first
    assert torch.equal(cache[3], before[0]) and torch.equal(cache[5], before[3]) and torch.equal(cache[2], before[1])
    assert torch.equal(cache[0], before[0]) and torch.equal(cache[4], before[4])


def test_swap_blocks_round_trip_between_pools():
    gpu, cpu = torch.randn(5, 4, 2, 8), torch.zeros(3, 4, 2, 8)
    original = gpu.clone()
    swap_blocks(gpu, cpu, [(4, 0), (1, 2)])
    assert (
        torch.equal(cpu[0], original[4])
        and torch.equal(cpu[2], original[1])
        and torch.equal(cpu[1], torch.zeros(4, 2, 8))
    )
    gpu.zero_()
    swap_blocks(cpu, gpu, [(0, 2), (2, 3)])
    assert (
        torch.equal(gpu[2], original[4])
        and torch.equal(gpu[3], original[1])
        and torch.equal(gpu[0], torch.zeros(4, 2, 8))
    )


def test_paged_cache_moves_every_layer_and_both_k_and_v():
    cache = PagedKVCache(num_layers=3, num_gpu_blocks=4, num_cpu_blocks=2, block_size=2, num_kv_heads=1, head_dim=4)
    cache.gpu.copy_(torch.randn_like(cache.gpu))
    original = cache.gpu.clone()
    cache.swap_out([(3, 1)])
    cache.gpu[:, :, 3] = 0
    cache.swap_in([(1, 0)])
    assert torch.equal(cache.gpu[:, :, 0], original[:, :, 3])
    cache.copy([(0, 2)])
    assert torch.equal(cache.gpu[:, :, 2], original[:, :, 3])
    assert torch.equal(cache.key(1)[2], original[0, 1, 3]) and torch.equal(cache.value(2)[2], original[1, 2, 3])
    assert cache.bytes_per_block == 2 * 3 * 2 * 1 * 4 * 4


def test_backend_choice(monkeypatch):
    monkeypatch.delenv("KVSCHED_ATTENTION", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert choose_backend("cpu") == "torch"
    assert choose_backend("cuda") == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choose_backend("cpu") == "triton"
    monkeypatch.setenv("KVSCHED_ATTENTION", "loop")
    assert choose_backend("cpu") == "loop"
    with pytest.raises(ValueError, match="unknown attention backend"):
        choose_backend("cpu", "flash")
