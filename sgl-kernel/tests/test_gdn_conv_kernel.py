"""The causal conv1d kernels (`causal_conv1d_fwd` and `causal_conv1d_update`, backend triton) against their torch
references and the per-token oracle: float32 on CPU under the Triton interpreter, hypothesis over varlen
batches (empty sequences, sequences shorter than K-1, tiles that cross sequence starts), kernel widths 2-5,
bias or none, SiLU or none, slot -1 (no state), a strided input and a layer view of the pool; a prompt
convolved in two calls equals one call. bf16 at Qwen3.5 shapes on CUDA (marked `gpu`)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_inputs import close, conv_case, conv_oracle, cu_of
from sgl_kernel.gdn import (
    causal_conv1d_fwd,
    causal_conv1d_fwd_torch,
    causal_conv1d_update,
    causal_conv1d_update_torch,
)

pytest.importorskip("triton")

from sgl_kernel.testing import interpreted  # noqa: E402

KERNEL_MODULE = "sgl_kernel.gdn._conv_triton"
SETTINGS = settings(max_examples=20, deadline=None, database=None, derandomize=True)


@given(lens=st.lists(st.integers(0, 40), min_size=1, max_size=4), c=st.integers(1, 150), kw=st.integers(2, 5),
       bias=st.booleans(), act=st.sampled_from(["silu", None]), no_state=st.booleans(), strided=st.booleans(),
       seed=st.integers(0, 999))
@SETTINGS
def test_interpreted_conv_equals_the_reference(lens, c, kw, bias, act, no_state, strided, seed):
    x, w, b, cu, pool, slots = conv_case(lens, c, kw, seed, bias=bias, strided=strided)
    if no_state:
        slots[seed % len(lens)] = -1
    ref_pool = pool.clone()
    ref = causal_conv1d_fwd_torch(x, w, b, ref_pool, slots, cu, activation=act)
    untouched = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    before = pool[untouched].clone()
    with interpreted(KERNEL_MODULE):
        out = causal_conv1d_fwd(x, w, b, pool, slots, cu, activation=act, backend="triton")
    close(out, ref)
    close(pool, ref_pool)
    assert torch.equal(pool[untouched], before)


@pytest.mark.parametrize("lens,kw", [([1, 2, 3, 0, 40], 4), ([17], 2), ([2, 1], 5)])
def test_interpreted_conv_equals_the_oracle(lens, kw):
    x, w, b, cu, pool, slots = conv_case(lens, 70, kw, sum(lens))
    oracle_pool = pool.clone()
    want = conv_oracle(x, w, b, cu, oracle_pool, slots)
    with interpreted(KERNEL_MODULE):
        got = causal_conv1d_fwd(x, w, b, pool, slots, cu, backend="triton")
    close(got, want)
    close(pool, oracle_pool)


@given(cut=st.integers(0, 30), kw=st.integers(2, 5), seed=st.integers(0, 99))
@settings(max_examples=8, deadline=None, database=None, derandomize=True)
def test_interpreted_conv_in_two_calls_equals_one(cut, kw, seed):
    """Chunked prefill at any cut (and decode steps after it) continue from the state the first call wrote."""
    x, w, b, _, pool, _ = conv_case([30], 33, kw, seed, num_slots=2)
    slots = torch.tensor([1], dtype=torch.int32)
    one = pool.clone()
    with interpreted(KERNEL_MODULE):
        want = causal_conv1d_fwd(x, w, b, one, slots, cu_of([30]), backend="triton")
        a = causal_conv1d_fwd(x[:cut], w, b, pool, slots, cu_of([cut]), backend="triton")
        rest = [causal_conv1d_fwd(x[cut:28], w, b, pool, slots, cu_of([28 - cut]), backend="triton")] \
            if cut < 28 else []
        steps = [causal_conv1d_update(x[t:t + 1], w, b, pool, slots, backend="triton") for t in range(max(cut, 28), 30)]
    close(torch.cat([a, *rest, *steps]), want)
    close(pool, one)


@given(bsz=st.integers(1, 6), c=st.integers(1, 150), kw=st.integers(2, 5), bias=st.booleans(),
       act=st.sampled_from(["silu", None]), pad=st.booleans(), seed=st.integers(0, 999))
@SETTINGS
def test_interpreted_conv_update_equals_the_reference(bsz, c, kw, bias, act, pad, seed):
    x, w, b, _, pool, slots = conv_case([1] * bsz, c, kw, seed, bias=bias)
    if pad:
        slots[seed % bsz] = -1
    ref_pool = pool.clone()
    ref = causal_conv1d_update_torch(x, w, b, ref_pool, slots, activation=act)
    with interpreted(KERNEL_MODULE):
        out = causal_conv1d_update(x, w, b, pool, slots, activation=act, backend="triton")
    close(out, ref)
    close(pool, ref_pool)
    assert torch.equal(out[slots < 0], torch.zeros_like(out[slots < 0]))


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("c", [8192, 1280])  # qwen3.5-4b TP1, qwen3.5-27b TP8
def test_cuda_conv_bf16_equals_the_reference(c):
    lens = [1000, 1, 2, 0, 77]
    x, w, b, cu, pool, slots = (t.cuda() if t is not None else None for t in conv_case(lens, c, 4, 0, bias=False))
    x, w, pool = x.to(torch.bfloat16), w.to(torch.bfloat16), pool.to(torch.bfloat16)
    ref_pool = pool.clone()
    ref = causal_conv1d_fwd_torch(x, w, None, ref_pool, slots, cu)
    out = causal_conv1d_fwd(x, w, None, pool, slots, cu)
    close(out.float().cpu(), ref.float().cpu(), 1e-2)
    assert torch.equal(pool, ref_pool)  # the state is a copy of inputs: exact
    dec_slots = torch.arange(pool.shape[0], device="cuda", dtype=torch.int32)  # a decode step of every slot
    xb = x[: dec_slots.shape[0]].clone()
    ref_pool = pool.clone()
    ref = causal_conv1d_update_torch(xb, w, None, ref_pool, dec_slots)
    out = causal_conv1d_update(xb, w, None, pool, dec_slots)
    close(out.float().cpu(), ref.float().cpu(), 1e-2)
    assert torch.equal(pool, ref_pool)
