"""What the FP8 MoE tests at real widths share: float experts ([E, 2I, H] gate_up, [E, H, I] down) stored as a
-FP8 checkpoint stores them (one e4m3 linear per expert and part, 128x128 block scales), their dequantized
values, and one TP rank's Fp8FusedMoE loaded from them."""

from __future__ import annotations

import torch

BLOCK = (128, 128)


def per_expert_fp8(gate_up: torch.Tensor, down: torch.Tensor) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(stored: shard id -> (e4m3 weight, scales), dequantized gate_up [E, 2I, H], dequantized down [E, H, I]);
    shard ids as expert_params_mapping names them: (expert, 0) gate, (expert, 1) up, (expert, None) down."""
    from sgl_kernel.quantization import dequantize_block_fp8, quantize_weight_block_fp8

    e, i = gate_up.shape[0], gate_up.shape[1] // 2
    floats = {sid: w for x in range(e) for sid, w in (((x, 0), gate_up[x, :i]), ((x, 1), gate_up[x, i:]),
                                                      ((x, None), down[x]))}
    stored = {sid: quantize_weight_block_fp8(w, BLOCK) for sid, w in floats.items()}
    deq = {sid: dequantize_block_fp8(q, s, BLOCK) for sid, (q, s) in stored.items()}
    deq_gate_up = torch.stack([torch.cat([deq[x, 0], deq[x, 1]]) for x in range(e)])
    return stored, deq_gate_up, torch.stack([deq[x, None] for x in range(e)])


def fp8_rank(stored: dict, e: int, h: int, i: int, tp) -> torch.nn.Module:
    """Rank `tp.rank`'s Fp8FusedMoE with every expert loaded through its weight loaders, as the model loader does."""
    from sglang.srt.layers.moe import Fp8FusedMoE, expert_params_mapping

    m = Fp8FusedMoE(e, h, i, tp, block=BLOCK)
    for fused, _, sid in expert_params_mapping(e):
        name = fused.rsplit(".", 1)[-1]
        getattr(m, name).weight_loader(getattr(m, name), stored[sid][0], sid)
        getattr(m, f"{name}_scale_inv").weight_loader(getattr(m, f"{name}_scale_inv"), stored[sid][1], sid)
    return m
