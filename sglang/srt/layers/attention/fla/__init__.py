"""Linear attention: Qwen3.5's Gated DeltaNet layer, its torch references (flash-linear-attention's ops: causal
conv, chunked and recurrent gated delta rule, gated RMSNorm, per-request recurrent state) and its kernel path
over sgl_kernel.gdn's Triton kernels and the state pool (pooled.py; SGLANG_GDN_BACKEND)."""
