"""The DeltaNet's output norm: RMSNorm over each value head, then a SiLU gate.

Its weight is a plain scale (`weight * norm(x)`, initialised to ones), unlike Qwen3.5's decoder norms,
which are zero-centred (`(1 + weight) * norm(x)`, models/qwen3_5.py): the checkpoints store the two
conventions side by side, and loading one kind of weight into the other is a silent error."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x, gate: (..., hidden_size) -> weight * rmsnorm(x) * silu(gate), in x's dtype. The statistics
        and the gate are float32; the normalized x is rounded to x's dtype before the weight, as the
        reference does."""
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(gate.float())).to(dtype)
