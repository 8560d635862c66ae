"""The Triton kernel under the interpreter (TRITON_INTERPRET=1) against the loop oracle, small shapes.

``triton.jit`` decides at decoration time whether to interpret, so the module is (re)loaded with
the variable set; the real GPU run of the same tests is ``benchmarks/gpu_check.sh``.
"""

from __future__ import annotations

import pytest
import torch

from kvsched.kernels import paged_attention_loop
from tests.kernel_cases import interpreted_triton, make_problem, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = [(1, 1), (1, 9), (5, 5), (3, 11), (2, 6)]  # decode, block edges, prefill, chunk after cache


@pytest.fixture(scope="module")
def triton_attention():
    restore = interpreted_triton()
    from kvsched.kernels.triton_attention import paged_attention_triton

    yield paged_attention_triton
    restore()


@pytest.mark.parametrize(
    "heads,head_dim,block_size",
    [((4, 4), 16, 4), ((4, 2), 24, 4), ((3, 1), 64, 8), ((9, 3), 16, 5)],
    ids=["MHA-d16-bs4", "GQA-d24-bs4", "MQA-d64-bs8", "GQA3-d16-bs5"],
)
def test_triton_matches_loop_fp32(triton_attention, heads, head_dim, block_size):
    problem = make_problem(SMALL, *heads, head_dim, block_size, seed=head_dim, device=DEVICE)
    want = paged_attention_loop(*(t.cpu() if isinstance(t, torch.Tensor) else t for t in problem))
    torch.testing.assert_close(triton_attention(*problem).cpu(), want, **tolerance(torch.float32))


def test_triton_matches_loop_bf16(triton_attention):
    problem = make_problem(SMALL, 4, 2, 16, 4, dtype=torch.bfloat16, seed=7, device=DEVICE)
    want = paged_attention_loop(*(t.cpu() if isinstance(t, torch.Tensor) else t for t in problem))
    torch.testing.assert_close(triton_attention(*problem).cpu(), want, **tolerance(torch.bfloat16))


def test_triton_takes_strides_not_contiguity(triton_attention):
    """Query as a strided view and the cache as one layer of a stacked pool, as the executor passes them."""
    q, k_cache, v_cache, cu, lens, tables, scale = make_problem(SMALL, 4, 2, 16, 4, seed=9, device=DEVICE)
    pool = torch.zeros((2, 2) + tuple(k_cache.shape), device=DEVICE)
    pool[0, 1], pool[1, 1] = k_cache, v_cache
    wide = torch.zeros(q.shape[0], q.shape[1], 2 * q.shape[2], device=DEVICE)
    wide[..., ::2] = q
    strided_q = wide[..., ::2]
    assert not strided_q.is_contiguous()
    got = triton_attention(strided_q, pool[0, 1], pool[1, 1], cu, lens, tables, scale)
    want = paged_attention_loop(q.cpu(), k_cache.cpu(), v_cache.cpu(), cu.cpu(), lens.cpu(), tables.cpu(), scale)
    torch.testing.assert_close(got.cpu(), want, **tolerance(torch.float32))


@pytest.mark.parametrize("splits", [2, 3, 8])
def test_triton_split_kv_matches_loop(triton_attention, splits):
    """Split-KV (the context shared out over several programs, then merged): same result, also
    with more splits than a sequence has tiles (empty splits) and with prefill rows in the batch."""
    cases = [(1, 1), (1, 40), (1, 97), (5, 5), (3, 50)]
    problem = make_problem(cases, 4, 2, 16, 4, seed=11, device=DEVICE)
    want = paged_attention_loop(*(t.cpu() if isinstance(t, torch.Tensor) else t for t in problem))
    got = triton_attention(*problem, num_splits=splits)
    torch.testing.assert_close(got.cpu(), want, **tolerance(torch.float32))
