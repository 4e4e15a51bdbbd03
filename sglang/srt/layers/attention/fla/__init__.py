"""Linear attention (flash-linear-attention's ops, as torch references): Qwen3.5's Gated DeltaNet layer,
its causal conv, chunked and recurrent gated delta rule, gated RMSNorm and per-request recurrent state."""
