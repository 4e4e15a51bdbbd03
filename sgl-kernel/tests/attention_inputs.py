"""Inputs and independent dense answers for the attention tests (shared by the reference and kernel tests).

Slot layout: a request of n tokens owns ceil(n / page_size) pages drawn at random from a pool with spare
pages; its tokens fill those pages in order, so with page size 16 the slots come in runs of 16 and with
page size 1 they are scattered one by one.

The dense answers use `F.scaled_dot_product_attention` per request on gathered, head-repeated K/V with a
`tril`-built mask: a formulation independent of the references (which use einsum over grouped heads and
a position comparison), so a wrong reference cannot hide a wrong kernel.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from hypothesis import strategies as st


def paged_slots(lens: list[int], page_size: int, g: torch.Generator) -> tuple[list[list[int]], int]:
    """Per request, its slots in sequence order; and the pool's slot count."""
    pages_per = [-(-n // page_size) for n in lens]
    n_pages = sum(pages_per) + 3  # spare pages: the pool is never exactly full
    order = torch.randperm(n_pages, generator=g).tolist()
    slots, used = [], 0
    for n, p in zip(lens, pages_per):
        pages = order[used:used + p]
        used += p
        slots.append([pages[t // page_size] * page_size + t % page_size for t in range(n)])
    return slots, n_pages * page_size


def _indptr(lens: list[int], dtype: torch.dtype) -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=dtype)


def extend_case(prefix_lens, extend_lens, hk, group, d, page_size, idx_dtype=torch.int32, seed=0,
                dtype=torch.float32, device="cpu"):
    """Positional args of extend_attention_fwd (sm_scale = 1/sqrt(d)) for the given requests."""
    g = torch.Generator().manual_seed(seed)
    kv_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
    slots, n_slots = paged_slots(kv_lens, page_size, g)
    k_buf = torch.randn(n_slots, hk, d, generator=g)
    v_buf = torch.randn(n_slots, hk, d, generator=g)
    q = torch.randn(sum(extend_lens), hk * group, d, generator=g)
    kv_indices = torch.tensor([s for r in slots for s in r], dtype=idx_dtype)
    args = (q.to(dtype), k_buf.to(dtype), v_buf.to(dtype), _indptr(extend_lens, idx_dtype),
            _indptr(kv_lens, idx_dtype), kv_indices)
    args = tuple(t.to(device) for t in args)
    return args + (max(extend_lens, default=0), d ** -0.5)


def decode_case(kv_lens, hk, group, d, page_size, idx_dtype=torch.int32, seed=0, dtype=torch.float32,
                device="cpu"):
    """Positional args of decode_attention_fwd (q, k_buf, v_buf, kv_indptr, kv_indices, max_kv_len,
    sm_scale)."""
    g = torch.Generator().manual_seed(seed)
    slots, n_slots = paged_slots(kv_lens, page_size, g)
    k_buf = torch.randn(n_slots, hk, d, generator=g)
    v_buf = torch.randn(n_slots, hk, d, generator=g)
    q = torch.randn(len(kv_lens), hk * group, d, generator=g)
    kv_indices = torch.tensor([s for r in slots for s in r], dtype=idx_dtype)
    args = (q.to(dtype), k_buf.to(dtype), v_buf.to(dtype), _indptr(kv_lens, idx_dtype), kv_indices)
    return tuple(t.to(device) for t in args) + (max(kv_lens, default=0), d ** -0.5)


def varlen_case(seg_lens, heads, group, d, idx_dtype=torch.int32, seed=0, dtype=torch.float32, device="cpu"):
    """Positional args of varlen_attention_fwd (q, k, v, cu_seqlens, max_seqlen, sm_scale); k and v
    have `heads` heads, q has heads * group."""
    g = torch.Generator().manual_seed(seed)
    n = sum(seg_lens)
    q = torch.randn(n, heads * group, d, generator=g)
    k = torch.randn(n, heads, d, generator=g)
    v = torch.randn(n, heads, d, generator=g)
    args = tuple(t.to(dtype) for t in (q, k, v)) + (_indptr(seg_lens, idx_dtype),)
    return tuple(t.to(device) for t in args) + (max(seg_lens, default=0), d ** -0.5)


def _sdpa(q, k, v, mask, scale):
    """q (Lq, Hq, D), k/v (Lk, Hk, D) -> (Lq, Hq, D) in float32, K/V heads repeated explicitly."""
    rep = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(rep, dim=1)
    v = v.float().repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return o.transpose(0, 1)


def dense_extend(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, max_q_len, sm_scale):
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        q_len, kv_len = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        if q_len == 0:
            continue
        idx = kv_indices[kv[b]:kv[b + 1]].long()
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(diagonal=kv_len - q_len)
        out[qo[b]:qo[b + 1]] = _sdpa(q[qo[b]:qo[b + 1]], k_buf[idx], v_buf[idx], mask, sm_scale)
    return out


def dense_decode(q, k_buf, v_buf, kv_indptr, kv_indices, max_kv_len, sm_scale):
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = kv_indptr.tolist()
    for b in range(q.shape[0]):
        if kv[b + 1] > kv[b]:
            idx = kv_indices[kv[b]:kv[b + 1]].long()
            out[b] = _sdpa(q[b:b + 1], k_buf[idx], v_buf[idx], None, sm_scale)[0]
    return out


def dense_varlen(q, k, v, cu_seqlens, max_seqlen, sm_scale):
    """One SDPA over all packed rows with a block-diagonal mask."""
    seg = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1), torch.diff(cu_seqlens.long().cpu()))
    seg = seg.to(q.device)
    if q.shape[0] == 0:
        return torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    return _sdpa(q, k, v, seg[:, None] == seg[None, :], sm_scale)


# hypothesis strategies: lengths that favour the edge cases 0 and 1
def lengths(hi: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([0, 1]), st.integers(0, hi))


GROUPS = st.sampled_from([1, 2, 4])
HEAD_DIMS = st.sampled_from([8, 16, 24])
PAGE_SIZES = st.sampled_from([1, 16])
IDX_DTYPES = st.sampled_from([torch.int32, torch.int64])
SEEDS = st.integers(0, 2**16)


# Where the Triton kernels can run in this process: under the interpreter when TRITON_INTERPRET=1 was set
# before triton was imported (the test process's environment), else on CUDA. Elsewhere the kernel cases
# skip, and test_attention_kernels.py reruns them in a subprocess started with TRITON_INTERPRET=1.
SUBPROCESS_MARKER = "SGL_KERNEL_ATTENTION_INTERPRETER_RUN"
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CUDA = torch.cuda.is_available() and not INTERPRETED
KERNELS_RUN_HERE = INTERPRETED or ON_CUDA
DEVICE = "cuda" if ON_CUDA else "cpu"
