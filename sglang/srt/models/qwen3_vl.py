"""Qwen3-VL: ViT with a learned, interpolated position table, 2D rotary and deepstack mergers, on a
Qwen3 text decoder with interleaved M-RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.configs.model_config import ModelConfig, VisionConfig
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.distributed.sequence_parallel import UlyssesShards, plan_sequence_split
from sglang.srt.layers.layernorm import LayerNorm
from sglang.srt.layers.linear import ColumnParallelLinear, RowParallelLinear
from sglang.srt.layers.rotary_embedding import VisionRotaryEmbedding
from sglang.srt.layers.vision_blocks import VisionBlock, VisionMLP, image_cu_seqlens, make_patch_embed, rot_pos_ids
from sglang.srt.layers.vision_pos_embed import CachedVisionRotary, FastPosEmbedInterpolator
from sglang.srt.models.qwen3 import Qwen3Model
from sglang.srt.models.vlm_base import QwenVLForConditionalGenerationBase


class Qwen3VLPatchMerger(nn.Module):
    """Folds each merge window of patches into one token. The main merger normalizes per patch
    before folding; deepstack mergers normalize the folded vector."""

    def __init__(self, cfg: VisionConfig, postshuffle_norm: bool, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        self.folded = cfg.hidden_size * cfg.spatial_merge_size**2
        self.postshuffle_norm = postshuffle_norm
        self.norm = LayerNorm(self.folded if postshuffle_norm else cfg.hidden_size, 1e-6, dtype)
        self.linear_fc1 = ColumnParallelLinear(self.folded, self.folded, bias=True, tp=tp, dtype=dtype)
        self.linear_fc2 = RowParallelLinear(self.folded, cfg.out_hidden_size, bias=True, tp=tp, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.folded  # explicit: a Ulysses shard may hold no tokens
        x = self.norm(x.view(rows, self.folded)) if self.postshuffle_norm else self.norm(x).view(rows, self.folded)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class Qwen3VisionTransformer(nn.Module):
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
        SGLANG_VIT_FAST_POS_EMBED, resolved by the caller). `sp`: the group the tokens are split over
        (`--enable-vit-ulysses-sp`; `tp` is then single-rank); None: every rank runs every token."""
        super().__init__()
        self.cfg = cfg
        self.sp = sp
        self.merge = cfg.spatial_merge_size
        self.patch_embed = make_patch_embed(
            patch_embed_linear, cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels, cfg.hidden_size,
            bias=True, dtype=dtype,
        )
        self.pos_embed = nn.Embedding(cfg.num_position_embeddings, cfg.hidden_size, dtype=dtype)
        self.pos_embed.weight.requires_grad_(False)
        self.num_grid_per_side = int(cfg.num_position_embeddings**0.5)
        self.rotary = VisionRotaryEmbedding(cfg.head_dim, cfg.rope_theta)
        # None selects the baseline: per-forward interpolation and rotary ids, unchanged.
        self.pos_interp = FastPosEmbedInterpolator(self.num_grid_per_side, self.merge) if fast_pos_embed else None
        self.rotary_ids = CachedVisionRotary(self.rotary, self.merge) if fast_pos_embed else None
        self.blocks = nn.ModuleList(
            [
                VisionBlock(
                    cfg.hidden_size,
                    cfg.num_heads,
                    VisionMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, tp, dtype),
                    norm="layernorm",
                    tp=tp,
                    dtype=dtype,
                )
                for _ in range(cfg.depth)
            ]
        )
        self.merger = Qwen3VLPatchMerger(cfg, postshuffle_norm=False, tp=tp, dtype=dtype)
        self.deepstack_visual_indexes = list(cfg.deepstack_visual_indexes)
        self.deepstack_merger_list = nn.ModuleList(
            [Qwen3VLPatchMerger(cfg, postshuffle_norm=True, tp=tp, dtype=dtype) for _ in self.deepstack_visual_indexes]
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.pos_embed.weight.dtype

    def interpolated_pos_embed(self, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """Bilinear resampling (align-corners) of the learned side x side table to each image's grid,
        emitted in merge-window order and repeated over frames."""
        side, m = self.num_grid_per_side, self.merge
        table = self.pos_embed.weight
        out = []
        for t, h, w in grid_thw:
            hs = torch.linspace(0, side - 1, h, device=table.device)
            ws = torch.linspace(0, side - 1, w, device=table.device)
            h0, w0 = hs.floor().long(), ws.floor().long()
            h1, w1 = (h0 + 1).clamp(max=side - 1), (w0 + 1).clamp(max=side - 1)
            dh, dw = (hs - h0)[:, None], (ws - w0)[None, :]
            emb = (
                table[(h0[:, None] * side + w0[None, :]).flatten()] * ((1 - dh) * (1 - dw)).reshape(-1, 1)
                + table[(h0[:, None] * side + w1[None, :]).flatten()] * ((1 - dh) * dw).reshape(-1, 1)
                + table[(h1[:, None] * side + w0[None, :]).flatten()] * (dh * (1 - dw)).reshape(-1, 1)
                + table[(h1[:, None] * side + w1[None, :]).flatten()] * (dh * dw).reshape(-1, 1)
            )
            emb = emb.view(h // m, m, w // m, m, -1).permute(0, 2, 1, 3, 4).reshape(h * w, -1)
            out.append(emb.repeat(t, 1))
        return torch.cat(out, dim=0)

    def pos_embeds(self, grid_thw: list[tuple[int, int, int]], dtype: torch.dtype) -> torch.Tensor:
        if self.pos_interp is None:
            return self.interpolated_pos_embed(grid_thw).to(dtype)
        return self.pos_interp(self.pos_embed.weight, grid_thw, dtype)

    def rotary_cos_sin(self, grid_thw: list[tuple[int, int, int]], device) -> tuple[torch.Tensor, torch.Tensor]:
        if self.rotary_ids is None:
            return self.rotary.cos_sin(rot_pos_ids(grid_thw, self.merge).to(device))
        return self.rotary_ids.cos_sin(grid_thw, device)

    def forward(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """-> (merged tokens, out_hidden * (1 + num_deepstack)): [main | deepstack_0 | ...]."""
        if self.sp is not None:
            return self.forward_ulysses(pixel_values, grid_thw)
        cos, sin = self.rotary_cos_sin(grid_thw, pixel_values.device)
        pos = self.pos_embeds(grid_thw, self.dtype)
        return self.forward_embedded(pixel_values, pos, cos, sin, image_cu_seqlens(grid_thw))

    def forward_embedded(self, pixel_values: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         segments) -> torch.Tensor:
        """The tower from patches on, given their position embeddings, rotary tables and attention segments
        (host list or `VisionSegments`): no host work, so a CUDA graph can capture it (vit_cuda_graph_runner)."""
        x = self.patch_embed(pixel_values) + pos
        deepstack = []
        for i, blk in enumerate(self.blocks):
            x = blk(x, segments, cos, sin)
            if i in self.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)](x))
        return torch.cat([self.merger(x), *deepstack], dim=-1)

    def forward_ulysses(self, pixel_values: torch.Tensor, grid_thw: list[tuple[int, int, int]]) -> torch.Tensor:
        """Same result as `forward`; this rank embeds, normalizes and merges only its shard of the patches
        (cut on image boundaries where that balances), attention sees all tokens for 1/P of the heads, and
        the merged rows (main and deepstack together) are gathered at the end."""
        cu = image_cu_seqlens(grid_thw)
        unit = self.merge**2
        shards = UlyssesShards(self.sp, plan_sequence_split(cu, self.sp.size, unit))
        mine = shards.local
        x = self.patch_embed(pixel_values[mine])
        x = x + self.pos_embeds(grid_thw, x.dtype)[mine]
        cos, sin = self.rotary_cos_sin(grid_thw, x.device)
        cos, sin = cos[mine], sin[mine]
        deepstack = []
        for i, blk in enumerate(self.blocks):
            x = blk(x, cu, cos, sin, shards)
            if i in self.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[self.deepstack_visual_indexes.index(i)](x))
        return shards.gather(torch.cat([self.merger(x), *deepstack], dim=-1), unit)


class Qwen3VLForConditionalGeneration(QwenVLForConditionalGenerationBase):
    vision_tower_cls = Qwen3VisionTransformer
    text_model_cls = Qwen3Model  # Qwen3-VL-MoE swaps in its sparse decoder

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
        self.num_deepstack = len(config.vision.deepstack_visual_indexes)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch):
        embeds, deepstack = self.embed_inputs(input_ids, forward_batch)
        hidden = self.model(None, positions, forward_batch, input_embeds=embeds, deepstack_embeds=deepstack)
        return self.logits_processor(hidden, self.lm_head.weight, forward_batch)


EntryClass = Qwen3VLForConditionalGeneration
