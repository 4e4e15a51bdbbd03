"""The chunked gated delta rule kernel (`chunk_gated_delta_rule_fwd`, backend triton) against its torch reference
and the per-token oracle: float32 on CPU under the Triton interpreter (`sgl_kernel.testing.interpreted`),
hypothesis over varlen batches (empty and length-1 sequences, partial chunks, several chunks), GQA ratios
1/2/3, head dims below, at and above one 64-column tile, chunk sizes 16/32/64, head views of one projection
and a layer view of the pool; the states in the pool before and after. bf16 at Qwen3.5 shapes on CUDA
(marked `gpu`).

Tolerance: 1e-5 of the largest output / state magnitude (the interpreter's dots are exact float32; the
differences are summation order)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_inputs import close, cu_of, delta_rule_case, delta_rule_oracle
from sgl_kernel.gdn import chunk_gated_delta_rule_fwd, chunk_gated_delta_rule_torch

pytest.importorskip("triton")

from sgl_kernel.testing import interpreted  # noqa: E402

KERNEL_MODULE = "sgl_kernel.gdn._chunk_triton"
SETTINGS = settings(max_examples=12, deadline=None, database=None, derandomize=True)


def _run(case, chunk):
    q, k, v, g, beta, cu, pool, slots = case
    ref_pool = pool.clone()
    ref = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, ref_pool, slots, chunk_size=chunk)
    untouched = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    before = pool[untouched].clone()
    with interpreted(KERNEL_MODULE):
        out = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu, pool, slots, chunk_size=chunk, backend="triton")
    close(out, ref)
    close(pool, ref_pool)
    assert torch.equal(pool[untouched], before), "a slot outside the batch was written"
    return out


@given(lens=st.lists(st.integers(0, 70), min_size=1, max_size=3), hk=st.integers(1, 2),
       group=st.sampled_from([1, 2, 3]),
       dims=st.sampled_from([(16, 16), (24, 8), (32, 48), (16, 72)]), chunk=st.sampled_from([16, 32, 64]),
       decay=st.sampled_from([0.02, 1.0, 20.0]), strided=st.booleans(), seed=st.integers(0, 999))
@SETTINGS
def test_interpreted_chunk_kernel_equals_the_reference(lens, hk, group, dims, chunk, decay, strided, seed):
    dk, dv = dims
    _run(delta_rule_case(lens, hk, group, dk, dv, seed, decay=decay, strided=strided), chunk)


@pytest.mark.parametrize("lens,hk,group,dk,dv,chunk", [
    ([1], 1, 1, 16, 16, 64),  # one token: a chunk of one row
    ([64, 65, 0, 1], 1, 2, 16, 16, 64),  # a full chunk, one past it, an empty sequence, a single token
    ([130], 2, 1, 128, 128, 64),  # Qwen3.5's head dims (two 64-column tiles of Dk and Dv), three chunks
    ([70, 5], 1, 3, 80, 72, 64),  # GQA 3 (Qwen3.5-27B's ratio), head dims masked inside the second tile
])
def test_interpreted_chunk_kernel_edges_equal_the_oracle(lens, hk, group, dk, dv, chunk):
    case = delta_rule_case(lens, hk, group, dk, dv, sum(lens), decay=2.0)
    q, k, v, g, beta, cu, pool, slots = case
    oracle_pool = pool.clone()
    want = delta_rule_oracle(q, k, v, g, beta, cu, oracle_pool, slots)
    got = _run(case, chunk)
    close(got, want)
    close(pool, oracle_pool)


def test_interpreted_chunk_kernel_carries_state_across_calls():
    """A prompt prefilled in two extend calls (a cut inside a chunk) equals one call, state included."""
    q, k, v, g, beta, _, pool, _ = delta_rule_case([90], 1, 2, 16, 16, 3, num_slots=3)
    slots = torch.tensor([2], dtype=torch.int32)
    one = pool.clone()
    with interpreted(KERNEL_MODULE):
        want = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_of([90]), one, slots, backend="triton")
        a = chunk_gated_delta_rule_fwd(q[:41], k[:41], v[:41], g[:41], beta[:41], cu_of([41]), pool, slots,
                                       backend="triton")
        b = chunk_gated_delta_rule_fwd(q[41:], k[41:], v[41:], g[41:], beta[41:], cu_of([49]), pool, slots,
                                       backend="triton")
    close(torch.cat([a, b]), want)
    close(pool, one)


def test_chunk_table_lists_every_chunk_of_every_sequence_without_a_host_sync():
    from sgl_kernel.gdn._chunk_triton import chunk_table

    cu = cu_of([5, 0, 64, 65, 1], torch.int64)
    lo, hi = chunk_table(cu, int(cu[-1]), 64)
    assert lo.shape == hi.shape == (135 // 64 + 5,)
    pairs = [(a, b) for a, b in zip(lo.tolist(), hi.tolist()) if b > a]
    assert pairs == [(0, 5), (5, 69), (69, 133), (133, 134), (134, 135)]
    assert all(a == b == 0 for a, b in zip(lo.tolist(), hi.tolist()) if b <= a)


def test_out_buffer_and_dtype():
    q, k, v, g, beta, cu, pool, slots = delta_rule_case([20], 1, 1, 16, 16, 4)
    out = torch.full((20, 1, 16), float("nan"), dtype=torch.float64)
    ref = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, pool.clone(), slots)
    with interpreted(KERNEL_MODULE):
        got = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu, pool, slots, out=out, backend="triton")
    assert got is out
    close(out, ref)


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hk,hv", [(16, 32), (2, 6), (8, 24)])  # qwen3.5-4b TP1, qwen3.5-27b TP8 and TP2
@pytest.mark.parametrize("lens", [[1], [64], [1000, 63, 1, 0, 129], [8192]])
def test_cuda_chunk_kernel_bf16_equals_the_float32_reference(lens, hk, hv):
    """bf16 q, k, v, beta (float32 g and state) at Qwen3.5's head dims, views of one projection output, against
    the float32 reference on the same (bf16-rounded) inputs. tf32 tensor-core dots: 1e-2 of the largest
    magnitude; `fp32_precision="ieee"` must agree with the reference to 1e-4."""
    case = delta_rule_case(lens, hk, hv // hk, 128, 128, len(lens), decay=1.0, strided=True)
    q, k, v, g, beta, cu, pool, slots = (x.cuda() for x in case)
    q, k, v, beta = (x.to(torch.bfloat16) for x in (q, k, v, beta))
    ref_pool = pool.clone()
    ref = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, ref_pool, slots)
    for precision, rel in (("tf32", 1e-2), ("ieee", 1e-4)):
        p = pool.clone()
        out = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu, p, slots, fp32_precision=precision)
        close(out.cpu(), ref.cpu(), rel)
        close(p.cpu(), ref_pool.cpu(), rel)
