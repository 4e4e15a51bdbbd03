"""The fused recurrent decode step (`recurrent_gated_delta_rule_update`, backend triton) against its torch
reference and the per-token oracle: float32 on CPU under the Triton interpreter, hypothesis over batches,
GQA 1/2/3, head dims, padded rows (slot -1), head views of one projection and a layer view of the pool;
decode steps after a chunked prefill equal one prefill. On CUDA (marked `gpu`): bf16 at Qwen3.5 shapes and
the step captured in a CUDA graph with the slot table as a graph input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gdn_inputs import close, cu_of, delta_rule_case, delta_rule_oracle
from sgl_kernel.gdn import (
    chunk_gated_delta_rule_fwd,
    recurrent_gated_delta_rule_update,
    recurrent_gated_delta_rule_update_torch,
)

pytest.importorskip("triton")

from sgl_kernel.testing import interpreted  # noqa: E402

KERNEL_MODULE = "sgl_kernel.gdn._recurrent_triton"
SETTINGS = settings(max_examples=20, deadline=None, database=None, derandomize=True)


@given(b=st.integers(1, 6), hk=st.integers(1, 2), group=st.sampled_from([1, 2, 3]),
       dims=st.sampled_from([(16, 16), (8, 24), (128, 128), (80, 40)]), pad=st.booleans(),
       strided=st.booleans(), seed=st.integers(0, 999))
@SETTINGS
def test_interpreted_recurrent_step_equals_the_reference(b, hk, group, dims, pad, strided, seed):
    dk, dv = dims
    q, k, v, g, beta, _, pool, slots = delta_rule_case([1] * b, hk, group, dk, dv, seed, num_slots=b + 3,
                                                       decay=2.0, strided=strided)
    if pad:
        slots[seed % b] = -1  # a padded row of a captured batch
    ref_pool = pool.clone()
    ref = recurrent_gated_delta_rule_update_torch(q, k, v, g, beta, ref_pool, slots)
    untouched = [i for i in range(pool.shape[0]) if i not in slots.tolist()]
    before = pool[untouched].clone()
    with interpreted(KERNEL_MODULE):
        out = recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, slots, backend="triton")
    close(out, ref)
    close(pool, ref_pool)
    assert torch.equal(pool[untouched], before)
    assert torch.equal(out[slots < 0], torch.zeros_like(out[slots < 0]))
    live = slots >= 0
    oracle_pool = pool.clone()  # one more step through the oracle from the kernel's state equals the reference's
    close(delta_rule_oracle(q[live], k[live], v[live], g[live], beta[live], cu_of([1] * int(live.sum())), oracle_pool,
                            slots[live]),
          recurrent_gated_delta_rule_update_torch(q, k, v, g, beta, ref_pool, slots)[live])


def test_interpreted_decode_after_chunked_prefill_equals_one_prefill():
    """Prefill 40 tokens with the chunk kernel, decode 6 with the step kernel: outputs and state equal one
    prefill of all 46 (what the engine does for one request, through one pool slot)."""
    q, k, v, g, beta, _, pool, _ = delta_rule_case([46], 2, 2, 32, 16, 8, num_slots=3, decay=0.5)
    slots = torch.tensor([1], dtype=torch.int32)
    one = pool.clone()
    with interpreted("sgl_kernel.gdn._chunk_triton"):
        want = chunk_gated_delta_rule_fwd(q, k, v, g, beta, cu_of([46]), one, slots, chunk_size=16, backend="triton")
        pre = chunk_gated_delta_rule_fwd(q[:40], k[:40], v[:40], g[:40], beta[:40], cu_of([40]), pool, slots,
                                         chunk_size=16, backend="triton")
    steps = []
    with interpreted(KERNEL_MODULE):
        for t in range(40, 46):
            s = slice(t, t + 1)
            steps.append(recurrent_gated_delta_rule_update(q[s], k[s], v[s], g[s], beta[s], pool, slots,
                                                           backend="triton"))
    close(torch.cat([pre, *steps]), want)
    close(pool, one)


# ----------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hk,hv", [(16, 32), (2, 6)])
def test_cuda_recurrent_step_bf16_and_graph_capture(hk, hv):
    """bf16 inputs at Qwen3.5's head dims against the float32 reference; then the step captured once in a CUDA
    graph and replayed with new inputs and a new slot table copied into its static buffers: equal to eager."""
    b = 64
    case = delta_rule_case([1] * b, hk, hv // hk, 128, 128, 0, num_slots=2 * b, decay=1.0, strided=True)
    q, k, v, g, beta, _, pool, slots = (x.cuda() for x in case)
    q, k, v, beta = (x.to(torch.bfloat16) for x in (q, k, v, beta))
    ref_pool = pool.clone()
    ref = recurrent_gated_delta_rule_update_torch(q, k, v, g, beta, ref_pool, slots)
    out = recurrent_gated_delta_rule_update(q, k, v, g, beta, pool, slots)
    close(out.cpu(), ref.cpu(), 1e-5)
    close(pool.cpu(), ref_pool.cpu(), 1e-5)

    static = [x.clone() for x in (q, k, v, g, beta, slots)]
    static_out = torch.empty_like(out)
    recurrent_gated_delta_rule_update(*static[:5], pool.clone(), static[5], out=static_out)  # compile outside
    graph_pool = pool.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recurrent_gated_delta_rule_update(*static[:5], graph_pool, static[5], out=static_out)
    graph_pool.copy_(pool)
    fresh = [x.cuda() for x in delta_rule_case([1] * b, hk, hv // hk, 128, 128, 1, num_slots=2 * b, strided=True)]
    new_slots = torch.randperm(2 * b, device="cuda")[:b].to(torch.int32)
    new_slots[3] = -1
    for dst, src in zip(static, [fresh[0].to(torch.bfloat16), fresh[1].to(torch.bfloat16), fresh[2].to(torch.bfloat16),
                                 fresh[3], fresh[4].to(torch.bfloat16), new_slots]):
        dst.copy_(src)
    graph.replay()
    eager_pool = pool.clone()
    eager = recurrent_gated_delta_rule_update(*static[:5], eager_pool, static[5])
    assert torch.equal(static_out, eager) and torch.equal(graph_pool, eager_pool)
