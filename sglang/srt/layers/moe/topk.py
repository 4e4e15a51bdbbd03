"""Router: softmax over the experts, the top k per token, renormalized when the config says so.
CUDA tensors take the sgl-kernel Triton kernel (`sgl_kernel.moe.topk_softmax`), which makes the same choice."""

from __future__ import annotations

import torch


def select_experts(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, k], expert ids int32 [T, k]) from router logits [T, E].

    Softmax in float32 (as transformers does). The k largest logits win and ties go to the lower expert
    id (a stable descending sort), so a token's experts never depend on the device or the batch it is in."""
    from sgl_kernel.moe import topk_softmax

    return topk_softmax(router_logits, top_k, renormalize)
