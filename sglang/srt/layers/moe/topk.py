"""Router: softmax over the experts, the top k per token, renormalized when the config says so.
CUDA tensors take the sgl-kernel Triton kernel (`sgl_kernel.moe.topk_softmax`), which makes the same choice."""

from __future__ import annotations

import torch


def select_experts_torch(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits.float(), dim=-1)
    ids = torch.sort(router_logits.float(), dim=-1, descending=True, stable=True).indices[:, :top_k]
    weights = probs.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int32 [T, k]) from router logits [T, E].

    Softmax in float32 (as transformers does). The k largest logits win and ties go to the lower expert
    id (a stable descending sort), so a token's experts never depend on the device or the batch it is in."""
    from sglang.srt.layers.moe.fused_moe import triton_moe_available

    if router_logits.is_cuda and triton_moe_available():
        from sgl_kernel.moe import topk_softmax

        return topk_softmax(router_logits, top_k, renormalize)
    return select_experts_torch(router_logits, top_k, renormalize)
