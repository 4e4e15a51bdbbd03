"""Next-token sampling kernels for the engine's sampler, each with a pure-torch reference.

- `sample_from_logits`: temperature, top-k, top-p, min-p and the seeded exponential race in one Triton
  launch (one program per row); greedy rows (temperature 0) take the argmax.
- `sample_from_logits_torch`: the sort-based reference with the same arguments.
- `hash_uniform_torch`: the counter-based uniforms of (seed, step, token id) that the race uses.
- `apply_token_bitmask`: constrained decoding's packed token bitmask applied to logits in place (one
  Triton pass over the packed words); `apply_token_bitmask_torch`: its unpacking reference.

This package imports without triton: the kernel module is imported on first use.
"""

from sgl_kernel.sampling.bitmask import apply_token_bitmask, apply_token_bitmask_torch, padded_words
from sgl_kernel.sampling.sample import hash_uniform_torch, sample_from_logits, sample_from_logits_torch

__all__ = ["apply_token_bitmask", "apply_token_bitmask_torch", "hash_uniform_torch", "padded_words",
           "sample_from_logits", "sample_from_logits_torch"]
