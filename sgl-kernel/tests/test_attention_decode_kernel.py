"""The Triton split-KV decode attention kernel against its torch reference (and the independent dense
formulation): float32 on CPU under the Triton interpreter or on CUDA, bf16 on CUDA only (marked `gpu`).
Without TRITON_INTERPRET=1 and without CUDA these cases skip and run in the subprocess started by
test_attention_kernels.py::test_kernel_cases_in_interpreter_subprocess."""

import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_inputs import (
    DEVICE, GROUPS, HEAD_DIMS, IDX_DTYPES, KERNELS_RUN_HERE, PAGE_SIZES, SEEDS, decode_case, dense_decode, lengths,
)
from sgl_kernel.attention import decode_attention_fwd, decode_attention_torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
kernels = pytest.mark.skipif(
    not (HAS_TRITON and KERNELS_RUN_HERE),
    reason="Triton kernels need CUDA or TRITON_INTERPRET=1 from process start; "
    "test_attention_kernels.py::test_kernel_cases_in_interpreter_subprocess runs these",
)
TOL = dict(rtol=1e-4, atol=1e-4)


@kernels
@settings(max_examples=20, deadline=None, database=None)
@given(kv_lens=st.lists(lengths(70), min_size=1, max_size=4), hk=st.sampled_from([1, 2]), group=GROUPS,
       d=HEAD_DIMS, page=PAGE_SIZES, idx=IDX_DTYPES, seed=SEEDS, splits=st.sampled_from([1, 3, 8]),
       slack=st.sampled_from([0, 0, 40]))
def test_decode_kernel_matches_reference(kv_lens, hk, group, d, page, idx, seed, splits, slack):
    q, kb, vb, kv, ind, max_kv, scale = decode_case(kv_lens, hk, group, d, page, idx, seed, device=DEVICE)
    # max_kv_len is an upper bound; with slack the split count is not capped by it
    args = (q, kb, vb, kv, ind, max_kv + slack, scale)
    got = decode_attention_fwd(*args, num_kv_splits=splits)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, decode_attention_torch(*args), **TOL)
    torch.testing.assert_close(got, dense_decode(*args), **TOL)


@kernels
@pytest.mark.parametrize("splits", [1, 3, 8, 16])
def test_decode_short_requests_leave_splits_empty(splits):
    # kv lens 0, 1 and 2 with up to 16 splits: most splits hold no key; kv_len 0 gives zeros
    q, kb, vb, kv, ind, _, scale = decode_case([1, 0, 2, 150], 2, 4, 16, 16, seed=splits, device=DEVICE)
    got = decode_attention_fwd(q, kb, vb, kv, ind, 150, scale, num_kv_splits=splits)
    assert bool((got[1] == 0).all())
    torch.testing.assert_close(got, decode_attention_torch(q, kb, vb, kv, ind, 150, scale), **TOL)
    torch.testing.assert_close(got[0], vb[ind[0].long()].repeat_interleave(4, 0), **TOL)  # one key: its value


@kernels
def test_decode_into_strided_out_from_strided_pool():
    q, kb, vb, kv, ind, max_kv, scale = decode_case([9, 40], 2, 2, 24, 1, torch.int64, seed=5, device=DEVICE)
    pool = torch.zeros(2, *kb.shape, device=DEVICE)
    pool[0] = kb
    out = torch.full((q.shape[0], q.shape[1], 32), 3.0, device=DEVICE)
    got = decode_attention_fwd(q, pool[0], vb, kv, ind, max_kv, scale, num_kv_splits=3, out=out[..., :24])
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out[..., :24], decode_attention_torch(q, kb, vb, kv, ind, max_kv, scale), **TOL)
    assert bool((out[..., 24:] == 3.0).all())


@kernels
def test_decode_empty_batch():
    q, kb, vb, kv, ind, _, scale = decode_case([], 1, 2, 8, 1, device=DEVICE)
    assert decode_attention_fwd(q, kb, vb, kv, ind, 0, scale).shape == (0, 2, 8)


@kernels
def test_decode_split_count_capped_by_max_kv_len_still_exact():
    # max_kv_len = 2 caps 8 splits to 2; the true lengths are read on the device
    q, kb, vb, kv, ind, _, scale = decode_case([2, 2, 1], 1, 1, 8, 1, seed=2, device=DEVICE)
    got = decode_attention_fwd(q, kb, vb, kv, ind, 2, scale, num_kv_splits=8)
    torch.testing.assert_close(got, dense_decode(q, kb, vb, kv, ind, 2, scale), **TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="needs CUDA")
@pytest.mark.parametrize("d", [64, 80, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("splits", [1, 8, 32])
def test_cuda_bf16_decode(d, group, splits):
    q, kb, vb, kv, ind, max_kv, scale = decode_case([1, 1024, 77, 4000, 0, 16], 4, group, d, 16, seed=d,
                                                   dtype=torch.bfloat16, device="cuda")
    got = decode_attention_fwd(q, kb, vb, kv, ind, max_kv, scale, num_kv_splits=splits)
    assert got.dtype == torch.bfloat16
    want = decode_attention_torch(q, kb, vb, kv, ind, max_kv, scale)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@kernels
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_decode_reads_an_fp8_kv_cache_as_q_dtype(kv_dtype):
    """An FP8 KV cache (--kv-cache-dtype): the kernel converts each K/V tile to q's dtype as it loads it,
    so it equals the reference over the same values already converted."""
    q, kb, vb, kv, ind, max_kv, scale = decode_case([9, 40, 70], 2, 4, 32, 16, seed=11, device=DEVICE)
    k8, v8 = kb.to(kv_dtype), vb.to(kv_dtype)
    got = decode_attention_fwd(q, k8, v8, kv, ind, max_kv, scale, num_kv_splits=3)
    torch.testing.assert_close(got, decode_attention_torch(q, k8.to(q.dtype), v8.to(q.dtype), kv, ind, max_kv, scale),
                               **TOL)
