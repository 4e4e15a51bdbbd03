"""The MoE ops and their torch references (the references are also the CPU path).

Layouts: x [T, H]; w13 [E, 2N, H] (each expert's gate rows, then its up rows); w2 [E, H, N];
topk_weights [T, k] float32; topk_ids [T, k] int32. An id of -1 names an expert this rank does not hold
(expert parallelism): that (token, slot) contributes nothing, and no kernel reads its row."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sgl_kernel import pick_backend


# ----------------------------------------------------------------------------- router
def topk_softmax_torch(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], ids int32 [T, k]): softmax in float32; the k largest logits, ties to the lower
    expert id (a stable descending sort of the logits, so the choice never depends on the batch)."""
    logits = router_logits.float()
    probs = torch.softmax(logits, dim=-1)
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = probs.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool, backend: str = "auto"):
    if router_logits.dim() != 2 or not 0 < top_k <= router_logits.shape[1]:
        raise ValueError(f"topk_softmax: logits [T, E] with 0 < top_k <= E, got {tuple(router_logits.shape)}, k={top_k}")
    if pick_backend(backend, router_logits) == "torch":
        return topk_softmax_torch(router_logits, top_k, renormalize)
    from sgl_kernel.moe._moe_triton import topk_softmax_triton

    return topk_softmax_triton(router_logits, top_k, renormalize)


# ----------------------------------------------------------------------------- alignment
def moe_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sorted_ids, expert_ids, num_post_padded) for the grouped GEMM, without a host sync.

    The T*k (token, slot) rows, numbered s = token * k + slot, grouped by expert (in s order within an
    expert), each expert's group padded to a multiple of block_m with the value T*k. sorted_ids has a
    fixed length (T*k + E*(block_m-1), rounded up to block_m), so the launch grid never waits for the
    counts; expert_ids[b] is the expert of row block b (-1 past num_post_padded), num_post_padded a
    one-element int32 tensor: the rows in use.

    Ids of -1 (experts on other ranks) go to a last bucket E past num_post_padded: no block reads them."""
    flat = topk_ids.reshape(-1).long()
    flat = torch.where(flat < 0, num_experts, flat)
    total = flat.numel()
    dev = flat.device
    cap = -(-(total + (num_experts + 1) * (block_m - 1)) // block_m) * block_m
    # scatter_add, not bincount: bincount on CUDA reads the largest id back to size its output (a sync)
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    first_of = torch.cumsum(counts, 0) - counts
    e_sorted = flat[order]
    rank = torch.arange(total, device=dev) - first_of[e_sorted]
    sorted_ids = torch.full((cap,), total, dtype=torch.int32, device=dev)
    sorted_ids[starts[e_sorted] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, cap, block_m, device=dev)
    expert_ids = torch.searchsorted(ends, block_starts, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    return sorted_ids, expert_ids, ends[num_experts - 1 : num_experts].to(torch.int32)


def moe_align_block_size_reference(topk_ids: torch.Tensor, block_m: int, num_experts: int):
    """The same in plain Python loops (what moe_align_block_size is tested against)."""
    flat = topk_ids.reshape(-1).tolist()
    total = len(flat)
    sorted_ids, expert_ids = [], []
    for e in range(num_experts):
        rows = [s for s, x in enumerate(flat) if x == e]  # -1 (another rank's expert) never matches
        if not rows:
            continue
        rows += [total] * (-len(rows) % block_m)
        sorted_ids += rows
        expert_ids += [e] * (len(rows) // block_m)
    return sorted_ids, expert_ids, len(sorted_ids)


# ----------------------------------------------------------------------------- experts
def fused_experts_torch(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor) -> torch.Tensor:
    """sum_k w_k * down_e(silu(gate_e(x)) * up_e(x)) over each token's k experts e, in x's dtype.
    Tokens are grouped by expert and only experts that received tokens are computed (ids -1 sort last,
    past every expert, and are never computed)."""
    out = torch.zeros_like(x)
    for expert, rows, weights in expert_groups(topk_ids, topk_weights, w13.shape[0], x.dtype):
        gate, up = F.linear(x[rows], w13[expert]).chunk(2, dim=-1)
        out.index_add_(0, rows, F.linear(F.silu(gate) * up, w2[expert]) * weights)
    return out


def expert_groups(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, dtype: torch.dtype):
    """(expert, token rows, their routing weights as a column in `dtype`) for every expert that received
    tokens, in expert order: the torch paths compute only those. Ids < 0 (other ranks' experts under
    expert parallelism) sort past every expert and are never yielded."""
    if topk_ids.numel() == 0:
        return
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    flat = torch.where(flat < 0, num_experts, flat)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts + 1)[:num_experts].tolist()
    token_of = order // k
    weight_of = topk_weights.reshape(-1)[order].to(dtype)
    start = 0
    for expert, n in enumerate(counts):
        if n:
            yield expert, token_of[start : start + n], weight_of[start : start + n, None]
        start += n


def _check(x, w13, w2, topk_weights, topk_ids) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"fused_experts: x [T, H], w13 [E, 2N, H], w2 [E, H, N]; got {tuple(x.shape)}, "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}")
    e, two_n, h = w13.shape
    if two_n % 2 or x.shape[1] != h or tuple(w2.shape) != (e, h, two_n // 2):
        raise ValueError(f"fused_experts: shapes do not fit: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, "
                         f"w2 {tuple(w2.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"fused_experts: topk_ids {tuple(topk_ids.shape)} / topk_weights "
                         f"{tuple(topk_weights.shape)} must both be [T, k] with T = {x.shape[0]}")
    if not (x.dtype == w13.dtype == w2.dtype):
        raise ValueError(f"fused_experts: x, w13, w2 must share a dtype: {x.dtype}, {w13.dtype}, {w2.dtype}")


def fused_experts_triton(x, w13, w2, topk_weights, topk_ids, config: dict | None = None,
                         has_remote: bool = True) -> torch.Tensor:
    """has_remote: topk_ids may hold -1 (expert parallelism); False skips zeroing the down buffer."""
    from sgl_kernel.moe._moe_triton import moe_block_config, plan_fused_moe

    t, k = topk_ids.shape
    e, two_n, h = w13.shape
    n = two_n // 2
    out = torch.zeros_like(x)
    if t == 0:
        return out
    if config is None and x.is_cuda:  # tuned per (E, N, dtype, device) when a file exists
        from sgl_kernel.moe.configs import device_name, dtype_str, pick_config

        config = pick_config(t, k, e, n, dtype_str(x.dtype), device_name())
    config = config or moe_block_config(t, k, e, on_cuda=x.is_cuda)
    x = x.contiguous()
    sorted_ids, expert_ids, num_post = moe_align_block_size(topk_ids, config["BLOCK_M"], e)
    inter = torch.empty((t * k, n), dtype=x.dtype, device=x.device)
    plan_fused_moe(x, w13, inter, None, sorted_ids, expert_ids, num_post, t * k, k, True, config).launch()
    # rows of ids -1 are never written: zeroed, they add nothing to the sum over k
    alloc = torch.zeros if has_remote else torch.empty
    down = alloc((t * k, h), dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).contiguous()
    plan_fused_moe(inter, w2, down, weights, sorted_ids, expert_ids, num_post, t * k, 1, False, config).launch()
    return down.view(t, k, h).sum(dim=1, dtype=torch.float32).to(x.dtype) if x.dtype != torch.float32 \
        else down.view(t, k, h).sum(dim=1)


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, backend: str = "auto", has_remote: bool = False) -> torch.Tensor:
    """has_remote: topk_ids may hold -1 for experts held by other ranks (expert parallelism)."""
    _check(x, w13, w2, topk_weights, topk_ids)
    if pick_backend(backend, x) == "torch":
        return fused_experts_torch(x, w13, w2, topk_weights, topk_ids)
    return fused_experts_triton(x, w13.contiguous(), w2.contiguous(), topk_weights, topk_ids, has_remote=has_remote)
