"""Attention kernels for the engine's language model and ViT, each with a pure-torch reference.

- `extend_attention_fwd`: prefill of new tokens over a paged KV pool with a cached prefix (causal among
  the new tokens, full over the prefix).
- `decode_attention_fwd`: one query per request over a paged KV pool, split-KV in two stages.
- `varlen_attention_fwd`: non-causal attention within packed variable-length segments (ViT).

The `*_fwd` functions run Triton kernels (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1) and
never sync with the host; the `*_torch` references take the same arguments, loop over requests in
float32, and run anywhere. All support GQA (Hq a multiple of Hk) and any head dim. This package imports
without triton: the kernel modules are imported on first use.
"""

from sgl_kernel.attention.decode import decode_attention_fwd, decode_attention_torch
from sgl_kernel.attention.extend import extend_attention_fwd, extend_attention_torch
from sgl_kernel.attention.varlen import varlen_attention_fwd, varlen_attention_torch

__all__ = [
    "decode_attention_fwd",
    "decode_attention_torch",
    "extend_attention_fwd",
    "extend_attention_torch",
    "varlen_attention_fwd",
    "varlen_attention_torch",
]
