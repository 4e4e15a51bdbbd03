"""Gated DeltaNet kernels (Qwen3.5's linear-attention layers) over the per-request state pool: the chunked
gated delta rule for prefill / extend, the fused recurrent decode step, and the causal depthwise conv1d with
SiLU (varlen prefill and decode update).

Every op has a torch reference (`*_torch`, same arguments), which is also the CPU path; `backend="auto"`
takes Triton for CUDA tensors. States are read from and written back to the pool in place through a slot
index per sequence. Layouts: `sgl_kernel.gdn.delta_rule` and `sgl_kernel.gdn.conv`."""

from sgl_kernel.gdn.conv import (
    causal_conv1d_fwd,
    causal_conv1d_fwd_torch,
    causal_conv1d_update,
    causal_conv1d_update_torch,
)
from sgl_kernel.gdn.delta_rule import (
    chunk_gated_delta_rule_fwd,
    chunk_gated_delta_rule_torch,
    recurrent_gated_delta_rule_update,
    recurrent_gated_delta_rule_update_torch,
)

__all__ = [
    "causal_conv1d_fwd",
    "causal_conv1d_fwd_torch",
    "causal_conv1d_update",
    "causal_conv1d_update_torch",
    "chunk_gated_delta_rule_fwd",
    "chunk_gated_delta_rule_torch",
    "recurrent_gated_delta_rule_update",
    "recurrent_gated_delta_rule_update_torch",
]
