"""The Triton extend and varlen attention kernels against their torch references (and the independent
dense formulation), in float32 on CPU under the Triton interpreter or on CUDA; bf16 and a large
no-score-matrix case on CUDA only (marked `gpu`). The decode kernel's cases are in
test_attention_decode_kernel.py.

`triton.jit` picks interpreted or compiled when a kernel module is imported, and triton.language's own
@jit helpers (tl.max, tl.sum, ...) when triton is imported, so the interpreter must be on from the start
of the process. A process without TRITON_INTERPRET=1 and without CUDA skips the kernel cases and
`test_kernel_cases_in_interpreter_subprocess` reruns them in a fresh `pytest` with TRITON_INTERPRET=1.
"""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_inputs import (
    DEVICE, GROUPS, HEAD_DIMS, IDX_DTYPES, KERNELS_RUN_HERE, PAGE_SIZES, SEEDS, SUBPROCESS_MARKER,
    dense_extend, dense_varlen, extend_case, lengths, varlen_case,
)
from sgl_kernel.attention import (
    extend_attention_fwd, extend_attention_torch, varlen_attention_fwd, varlen_attention_torch,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None
HERE = pathlib.Path(__file__).resolve().parent
KERNEL_FILES = [HERE / "test_attention_kernels.py", HERE / "test_attention_decode_kernel.py"]

kernels = pytest.mark.skipif(
    not (HAS_TRITON and KERNELS_RUN_HERE),
    reason="Triton kernels need CUDA or TRITON_INTERPRET=1 from process start; "
    "test_kernel_cases_in_interpreter_subprocess runs these",
)
TOL = dict(rtol=1e-4, atol=1e-4)
SETTINGS = settings(max_examples=20, deadline=None, database=None)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.skipif(KERNELS_RUN_HERE, reason="the kernel cases run in this process")
@pytest.mark.skipif(os.environ.get(SUBPROCESS_MARKER) == "1", reason="already the interpreter subprocess")
def test_kernel_cases_in_interpreter_subprocess():
    src = str(HERE.parent / "python")
    env = dict(os.environ, TRITON_INTERPRET="1", **{SUBPROCESS_MARKER: "1"})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "-q", *map(str, KERNEL_FILES), "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=HERE.parents[1], env=env, capture_output=True, text=True, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    passed = re.search(r"(\d+) passed", output)
    assert passed and int(passed.group(1)) > 0, output
    print(output.strip().splitlines()[-1])


@kernels
@SETTINGS
@given(reqs=st.lists(st.tuples(lengths(40), lengths(24)), min_size=1, max_size=4), hk=st.sampled_from([1, 2]),
       group=GROUPS, d=HEAD_DIMS, page=PAGE_SIZES, idx=IDX_DTYPES, seed=SEEDS, slack=st.sampled_from([0, 0, 9]))
def test_extend_kernel_matches_reference(reqs, hk, group, d, page, idx, seed, slack):
    args = extend_case([p for p, _ in reqs], [e for _, e in reqs], hk, group, d, page, idx, seed, device=DEVICE)
    args = args[:6] + (args[6] + slack, args[7])  # max_q_len is an upper bound
    got = extend_attention_fwd(*args)
    assert got.shape == args[0].shape and got.dtype == torch.float32
    torch.testing.assert_close(got, extend_attention_torch(*args), **TOL)
    torch.testing.assert_close(got, dense_extend(*args), **TOL)


@kernels
@settings(max_examples=15, deadline=None, database=None)
@given(segs=st.lists(lengths(36), min_size=1, max_size=5), heads=st.sampled_from([1, 2]), group=GROUPS,
       d=HEAD_DIMS, idx=IDX_DTYPES, seed=SEEDS)
def test_varlen_kernel_matches_reference(segs, heads, group, d, idx, seed):
    args = varlen_case(segs, heads, group, d, idx, seed, device=DEVICE)
    got = varlen_attention_fwd(*args)
    torch.testing.assert_close(got, varlen_attention_torch(*args), **TOL)
    torch.testing.assert_close(got, dense_varlen(*args), **TOL)


@kernels
@pytest.mark.parametrize("d", [32, 72])
def test_extend_long_prefix_several_blocks(d):
    # prefix and new tokens both span several key/query blocks; page size 16, GQA 4
    args = extend_case([70, 0, 33], [37, 20, 1], 2, 4, d, 16, seed=d, device=DEVICE)
    torch.testing.assert_close(extend_attention_fwd(*args), extend_attention_torch(*args), **TOL)


@kernels
def test_extend_writes_into_strided_out_and_reads_strided_pool():
    q, kb, vb, qo, kv, idx, mq, scale = extend_case([5, 17], [3, 16], 2, 2, 16, 16, seed=3, device=DEVICE)
    # the pool as one layer of a (layers, slots, Hk, D) buffer, the V heads interleaved with padding
    pool = torch.zeros(3, *kb.shape, dtype=kb.dtype, device=DEVICE)
    pool[1] = kb
    vwide = torch.zeros(vb.shape[0], 2 * vb.shape[1], vb.shape[2], device=DEVICE)
    vwide[:, ::2] = vb
    out = torch.full((q.shape[0], q.shape[1], 2 * q.shape[2]), 5.0, device=DEVICE)
    view = out[..., : q.shape[2]]
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)  # head-major q
    got = extend_attention_fwd(qt, pool[1], vwide[:, ::2], qo, kv, idx, mq, scale, out=view)
    assert got.data_ptr() == view.data_ptr()
    torch.testing.assert_close(view, extend_attention_torch(q, kb, vb, qo, kv, idx, mq, scale), **TOL)
    assert bool((out[..., q.shape[2]:] == 5.0).all())


@kernels
@pytest.mark.parametrize("pad", [0, 1, 4])
def test_varlen_rows_whose_strides_are_or_are_not_16_byte_multiples(pad):
    # pad 0 / 4: every stride a multiple of 16 bytes, launched in 16-byte units; pad 1: head stride d + 1,
    # the fallback launch with strides in elements
    q, k, v, cu, ms, sc = varlen_case([9, 20, 3], 2, 2, 24, seed=pad, device=DEVICE)
    wide = [torch.zeros(*t.shape[:2], t.shape[2] + pad, device=DEVICE) for t in (q, k, v)]
    for w, t in zip(wide, (q, k, v)):
        w[..., : t.shape[2]] = t
    qs, ks, vs = (w[..., : q.shape[2]] for w in wide)
    torch.testing.assert_close(varlen_attention_fwd(qs, ks, vs, cu, ms, sc), varlen_attention_torch(q, k, v, cu, ms, sc),
                               **TOL)


@kernels
def test_extend_and_varlen_with_nothing_to_do():
    q, kb, vb, qo, kv, idx, mq, scale = extend_case([4, 0], [0, 0], 1, 2, 8, 1, device=DEVICE)
    assert extend_attention_fwd(q, kb, vb, qo, kv, idx, mq, scale).shape == (0, 2, 8)
    qv, k, v, cu, ms, sc = varlen_case([0, 0], 1, 1, 8, device=DEVICE)
    assert varlen_attention_fwd(qv, k, v, cu, ms, sc).shape == (0, 1, 8)


@kernels
@pytest.mark.skipif(DEVICE != "cuda", reason="the interpreter mishandles half precision")
def test_extend_into_half_precision_out_from_float32_inputs():
    args = extend_case([6], [5], 1, 2, 24, 1, seed=11, device=DEVICE)
    out = torch.empty(args[0].shape, dtype=torch.float16, device=DEVICE)
    got = extend_attention_fwd(*args, out=out)
    torch.testing.assert_close(got.float(), extend_attention_torch(*args), rtol=2e-3, atol=2e-3)


# ---- CUDA only -------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not (HAS_TRITON and torch.cuda.is_available()), reason="needs CUDA")
BF16_TOL = dict(rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("d", [64, 72, 80, 128, 256])  # 256: Qwen3.5's full-attention layers
@pytest.mark.parametrize("page", [1, 16])
def test_cuda_bf16_extend_and_varlen(d, page):
    args = extend_case([0, 300, 1, 129], [200, 77, 1, 128], 8, 4, d, page, seed=d, dtype=torch.bfloat16,
                       device="cuda")
    got = extend_attention_fwd(*args)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), extend_attention_torch(*args).float(), **BF16_TOL)
    vargs = varlen_case([256, 0, 1, 1000, 64], 16, 1, d, seed=d, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(varlen_attention_fwd(*vargs).float(), varlen_attention_torch(*vargs).float(),
                               **BF16_TOL)


@pytest.mark.gpu
@needs_cuda
def test_cuda_float32_extend_at_head_dim_256():
    """The float32 tiles at head_dim 256 take 16-key blocks (32 spill on sm_90a); tf32 dots, so tf32 tolerance."""
    args = extend_case([0, 300, 1], [200, 77, 129], 4, 4, 256, 16, seed=256, device="cuda")
    got = extend_attention_fwd(*args)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, extend_attention_torch(*args), **BF16_TOL)


@pytest.mark.gpu
@needs_cuda
def test_cuda_large_extend_allocates_no_score_matrix():
    t, hq, hk, d = 8192, 32, 8, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    kb = torch.randn(t + 64, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    vb = torch.randn(t + 64, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q = torch.randn(t, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    idx = torch.randperm(t + 64, device="cuda", generator=g)[:t].to(torch.int32)
    indptr = torch.tensor([0, t], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    extend_attention_fwd(q, kb, vb, indptr, indptr, idx, t, d ** -0.5, out=out)
    torch.cuda.synchronize()
    delta = torch.cuda.max_memory_allocated() - base
    assert delta < t * t * hq * 2 // 1000, f"extend allocated {delta} bytes"
    # spot-check the last 64 queries (they see every key) against a dense computation of those rows
    rows = slice(t - 64, t)
    k = kb[idx.long()].float().repeat_interleave(hq // hk, 1)
    v = vb[idx.long()].float().repeat_interleave(hq // hk, 1)
    s = torch.einsum("qhd,nhd->hqn", q[rows].float(), k) * d ** -0.5
    pos = torch.arange(t, device="cuda")
    s = s.masked_fill(pos[None, None, :] > pos[rows][None, :, None], float("-inf"))
    want = torch.einsum("hqn,nhd->qhd", torch.softmax(s, -1), v)
    torch.testing.assert_close(out[rows].float(), want, **BF16_TOL)


@kernels
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_extend_reads_an_fp8_kv_cache_as_q_dtype(kv_dtype):
    args = extend_case([0, 37, 5], [20, 9, 1], 2, 2, 32, 4, seed=13, device=DEVICE)
    q, kb, vb = args[:3]
    k8, v8 = kb.to(kv_dtype), vb.to(kv_dtype)
    got = extend_attention_fwd(q, k8, v8, *args[3:])
    ref = extend_attention_torch(q, k8.to(q.dtype), v8.to(q.dtype), *args[3:])
    torch.testing.assert_close(got, ref, **TOL)


@kernels
@pytest.mark.parametrize("d", [72, 80, 96])
def test_varlen_head_dims_that_are_no_power_of_two_run_in_two_pieces(d):
    """The vision towers' 72 (Qwen3-VL-8B/32B, MoE) and 80 (Qwen2.5-VL) run as 64 + 16 columns (96: 64 + 32)
    instead of padding to 128; the result is the reference's."""
    from sgl_kernel.attention._prefill_triton import head_dim_blocks

    main, tail = head_dim_blocks(d)
    assert main == 64 and tail == (32 if d == 96 else 16)
    args = varlen_case([5, 33, 17], 2, 1, d, seed=d, device=DEVICE)
    torch.testing.assert_close(varlen_attention_fwd(*args), varlen_attention_torch(*args), **TOL)
    torch.testing.assert_close(varlen_attention_fwd(*args), dense_varlen(*args), **TOL)
