"""torch's scaled_dot_product_attention as the pure-torch paths call it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# cuDNN's SDPA builds an execution plan per new shape: every decode step has a new context length, and
# that planning took 8.8 ms of host time per call on an H200 (torch 2.11), 35 ms of a 4-layer decode step
_CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention on (B, H, N, D) tensors, without the cuDNN backend on CUDA."""
    if q.is_cuda:
        with sdpa_kernel(_CUDA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)
