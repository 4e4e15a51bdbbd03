"""Per-request recurrent state of the Gated DeltaNet layers, owned outside the layers.

A request holds, for each linear-attention layer, the conv history (the last K-1 conv inputs) and the
delta-rule state. Both are zero for a new request; a prefill chunk or decode step reads them and writes
the new values back in place (`copy_`), never rebinding the tensors, so the tensors may be views into
a pool's storage: the state pool (state_pool.py) holds one slot per request-table row and hands out
`GDNRequestState`s whose tensors view that slot. Nothing here keys states by request: the caller passes one per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GDNLayerState:
    """One request, one layer. conv: (conv_dim, K-1), oldest input first; recurrent: (Hv, Dk, Dv)."""

    conv: torch.Tensor
    recurrent: torch.Tensor


@dataclass(frozen=True)
class GDNStateShape:
    """Sizes of one request's state on this TP rank (local heads and channels)."""

    num_layers: int  # linear-attention layers
    conv_dim: int
    conv_kernel: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_dtype: torch.dtype = torch.float32  # the activations' dtype
    recurrent_dtype: torch.dtype = torch.float32  # the reference keeps the delta-rule state in float32

    def bytes_per_request(self) -> int:
        conv = self.num_layers * self.conv_dim * (self.conv_kernel - 1) * self.conv_dtype.itemsize
        rec = self.num_layers * self.num_value_heads * self.key_head_dim * self.value_head_dim
        return conv + rec * self.recurrent_dtype.itemsize

    def new_request(self, device: torch.device | str = "cpu") -> "GDNRequestState":
        return GDNRequestState(
            torch.zeros(self.num_layers, self.conv_dim, self.conv_kernel - 1, dtype=self.conv_dtype, device=device),
            torch.zeros(self.num_layers, self.num_value_heads, self.key_head_dim, self.value_head_dim,
                        dtype=self.recurrent_dtype, device=device),
        )


@dataclass(frozen=True)
class GDNRequestState:
    """Every linear-attention layer's state of one request: conv (L, conv_dim, K-1), recurrent
    (L, Hv, Dk, Dv); layer i is the i-th linear-attention layer of the model, not the decoder index."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    def layer(self, i: int) -> GDNLayerState:
        return GDNLayerState(self.conv[i], self.recurrent[i])

    def reset(self) -> None:
        """Back to a new request's state (a reused slot)."""
        self.conv.zero_()
        self.recurrent.zero_()

    def clone(self) -> "GDNRequestState":
        return GDNRequestState(self.conv.clone(), self.recurrent.clone())
