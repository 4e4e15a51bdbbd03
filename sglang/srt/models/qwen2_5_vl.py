"""Qwen2.5-VL: windowed ViT (full attention only in a few blocks) with 2D rotary and an RMSNorm
patch merger, on a Qwen2 text decoder with sectioned M-RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.configs.model_config import ModelConfig, VisionConfig
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.distributed.sequence_parallel import UlyssesShards, plan_sequence_split
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import ColumnParallelLinear, RowParallelLinear
from sglang.srt.layers.rotary_embedding import VisionRotaryEmbedding
from sglang.srt.layers.vision_blocks import (
    VisionBlock,
    VisionGatedMLP,
    image_cu_seqlens,
    make_patch_embed,
    rot_pos_ids,
)
from sglang.srt.layers.vision_pos_embed import CachedVisionRotary
from sglang.srt.models.qwen2 import Qwen2Model
from sglang.srt.models.vlm_base import QwenVLForConditionalGenerationBase


class _GELU(nn.Module):
    def forward(self, x):
        return F.gelu(x)


class Qwen2_5_VLPatchMerger(nn.Module):
    def __init__(self, cfg: VisionConfig, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        self.folded = cfg.hidden_size * cfg.spatial_merge_size**2
        self.ln_q = RMSNorm(cfg.hidden_size, 1e-6, dtype)
        # indices 0 and 2 mirror the checkpoint's nn.Sequential names (mlp.0, mlp.2)
        self.mlp = nn.ModuleList(
            [
                ColumnParallelLinear(self.folded, self.folded, bias=True, tp=tp, dtype=dtype),
                _GELU(),
                RowParallelLinear(self.folded, cfg.out_hidden_size, bias=True, tp=tp, dtype=dtype),
            ]
        )

    def forward(self, x):
        x = self.ln_q(x).view(x.numel() // self.folded, self.folded)  # explicit: a Ulysses shard may be empty
        for layer in self.mlp:
            x = layer(x)
        return x


def window_index(grid_thw: list[tuple[int, int, int]], merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """Order of merged tokens grouped into window x window tiles, and the patch-level segment
    boundaries of those tiles (partial tiles at the right/bottom edges are smaller)."""
    order, cu, base = [], [0], 0
    unit = merge * merge
    for t, h, w in grid_thw:
        gh, gw = h // merge, w // merge
        ids = torch.arange(t * gh * gw).view(t, gh, gw)
        for f in range(t):
            for r in range(0, gh, window):
                for c in range(0, gw, window):
                    tile = ids[f, r : r + window, c : c + window].reshape(-1)
                    order.append(tile + base)
                    cu.append(cu[-1] + tile.numel() * unit)
        base += t * gh * gw
    return torch.cat(order), cu


class Qwen2_5_VisionTransformer(nn.Module):
    def __init__(
        self,
        cfg: VisionConfig,
        tp: TPInfo = SINGLE_RANK,
        dtype=None,
        patch_embed_linear: bool = True,
        fast_pos_embed: bool = True,
        sp: TPInfo | None = None,
    ):
        """`patch_embed_linear` / `fast_pos_embed`: the fields of `ViTStrategy` (SGLANG_VIT_PATCH_EMBED_LINEAR /
        SGLANG_VIT_FAST_POS_EMBED, resolved by the caller); fast_pos_embed caches only the rotary indices here:
        Qwen2.5-VL has no learned position table. `sp`: the group the tokens are split over
        (`--enable-vit-ulysses-sp`; `tp` is then single-rank); None: every rank runs every token."""
        super().__init__()
        self.cfg = cfg
        self.sp = sp
        self.merge = cfg.spatial_merge_size
        self.window = cfg.window_size // cfg.spatial_merge_size // cfg.patch_size
        self.fullatt_block_indexes = set(cfg.fullatt_block_indexes)
        self.patch_embed = make_patch_embed(
            patch_embed_linear, cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.hidden_size,
            bias=False, dtype=dtype,
        )
        self.rotary = VisionRotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        self.rotary_ids = CachedVisionRotary(self.rotary, self.merge) if fast_pos_embed else None  # None: baseline
        self.blocks = nn.ModuleList(
            [
                VisionBlock(
                    cfg.hidden_size,
                    cfg.num_heads,
                    VisionGatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, tp, dtype),
                    norm="rmsnorm",
                    tp=tp,
                    dtype=dtype,
                )
                for _ in range(cfg.depth)
            ]
        )
        self.merger = Qwen2_5_VLPatchMerger(cfg, tp, dtype)

    def rotary_cos_sin(self, grid_thw: list[tuple[int, int, int]], device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rotary_ids is None:
            return self.rotary.cos_sin(rot_pos_ids(grid_thw, self.merge).to(device))
        return self.rotary_ids.cos_sin(grid_thw, device)

    def forward(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        if self.sp is not None:
            return self.forward_ulysses(pixel_values, grid_thw)
        unit = self.merge * self.merge
        x = self.patch_embed(pixel_values)
        n = x.shape[0]
        win_idx, cu_window = window_index(grid_thw, self.merge, self.window)
        win_idx = win_idx.to(x.device)

        def to_window_order(t: torch.Tensor) -> torch.Tensor:
            return t.view(n // unit, unit, -1)[win_idx].reshape(n, -1)

        x = to_window_order(x)
        cos, sin = self.rotary_cos_sin(grid_thw, x.device)
        cos, sin = to_window_order(cos), to_window_order(sin)
        cu_full = image_cu_seqlens(grid_thw)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cu_full if i in self.fullatt_block_indexes else cu_window, cos, sin)
        return self.merger(x)[torch.argsort(win_idx)]

    def forward_ulysses(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """Same result as `forward`. The pixel rows are put in window order first (the patch embedding
        works row by row, so this equals reordering its output), the window-ordered sequence is split on
        window boundaries where that balances, window and full-attention layers both use the global
        segments, and the gathered merged rows are put back in image order."""
        unit = self.merge * self.merge
        n = pixel_values.shape[0]
        win_idx, cu_window = window_index(grid_thw, self.merge, self.window)
        win_idx = win_idx.to(pixel_values.device)

        def to_window_order(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(n // unit, unit, -1)[win_idx].reshape(n, -1)

        shards = UlyssesShards(self.sp, plan_sequence_split(cu_window, self.sp.size, unit))
        mine = shards.local
        x = self.patch_embed(to_window_order(pixel_values)[mine])
        cos, sin = self.rotary_cos_sin(grid_thw, x.device)
        cos, sin = to_window_order(cos)[mine], to_window_order(sin)[mine]
        cu_full = image_cu_seqlens(grid_thw)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cu_full if i in self.fullatt_block_indexes else cu_window, cos, sin, shards)
        return shards.gather(self.merger(x), unit)[torch.argsort(win_idx)]


class Qwen2_5_VLForConditionalGeneration(QwenVLForConditionalGenerationBase):
    vision_tower_cls = Qwen2_5_VisionTransformer
    text_model_cls = Qwen2Model
    def __init__(
        self,
        config: ModelConfig,
        tp: TPInfo = SINGLE_RANK,
        dtype: torch.dtype | None = None,
        vit: ViTStrategy = ViTStrategy(),
        quant=None,
    ):
        super().__init__(config, tp, dtype)
        self.init_towers(dtype, vit, quant)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch):
        embeds, _ = self.embed_inputs(input_ids, forward_batch)
        hidden = self.model(None, positions, forward_batch, input_embeds=embeds)
        return self.logits_processor(hidden, self.lm_head.weight, forward_batch)


EntryClass = Qwen2_5_VLForConditionalGeneration
