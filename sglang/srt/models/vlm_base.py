"""What Qwen3-VL and Qwen2.5-VL share: LM head (tied or not), per-image ViT calls, weight-name rules."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed.dp_encoder import dp_encode, frame_groups
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.distributed.sequence_parallel import vision_tower_parallelism
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead
from sglang.srt.layers.quantization.kv_cache import is_scale_tensor
from sglang.srt.multimodal.deferred_decode import materialize_pixels
from sglang.srt.multimodal.mm_types import EncodedImage
from sglang.srt.multimodal.still_images import concat_pixel_rows, widen_still_rows


class QwenVLForConditionalGenerationBase(nn.Module):
    vision_tower_cls: type[nn.Module]  # each model's, built by init_towers
    text_model_cls: type[nn.Module]
    # checkpoint name fragment -> (our fused parameter fragment, shard id)
    stacked_params_mapping = [
        (".qkv_proj.", ".q_proj.", "q"),
        (".qkv_proj.", ".k_proj.", "k"),
        (".qkv_proj.", ".v_proj.", "v"),
        (".gate_up_proj.", ".gate_proj.", 0),
        (".gate_up_proj.", ".up_proj.", 1),
    ]

    def __init__(self, config: ModelConfig, tp: TPInfo = SINGLE_RANK, dtype: torch.dtype | None = None):
        super().__init__()
        self.config = config
        self.tp = tp
        self.dtype_ = dtype or torch.get_default_dtype()
        self.vision_dp: TPInfo | None = None  # --mm-enable-dp-encoder at TP > 1: the group images are split over
        # SGLANG_VIT_ENABLE_CUDA_GRAPH: a callable (pixels, grids) -> the tower's output that the model runner
        # attaches (model_executor/vit_cuda_graph_runner.py); None runs the tower itself
        self.vit_graph = None

    def init_towers(self, dtype: torch.dtype | None, vit, quant) -> None:
        """`vision_tower_cls` and `text_model_cls` of the subclass, and the LM head. The tower is sharded
        over TP, or replicated for `--mm-enable-dp-encoder`, or split by tokens for Ulysses SP (`vit`: the
        resolved ViTStrategy)."""
        cfg, tp = self.config, self.tp
        vision_tp, sp = vision_tower_parallelism(tp, vit.ulysses_sp, cfg.vision.num_heads, vit.dp_encoder)
        self.vision_dp = tp if vit.dp_encoder and tp.size > 1 else None  # --mm-enable-dp-encoder
        self.towers = vit.towers  # EPD: "text" (--language-only) or "vision" (--encoder-only) builds one half
        self.visual = None
        if vit.towers != "text":
            self.visual = self.vision_tower_cls(cfg.vision, vision_tp, dtype, patch_embed_linear=vit.patch_embed_linear,
                                                fast_pos_embed=vit.fast_pos_embed, sp=sp)
        if vit.towers != "vision":
            self.model = self.text_model_cls(cfg.text, tp, dtype, quant)
            self.init_lm_head()

    def init_lm_head(self) -> None:
        text = self.config.text
        if self.config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(text.vocab_size, text.hidden_size, self.tp, self.dtype_)
        self.logits_processor = LogitsProcessor(text.vocab_size, self.tp)

    @staticmethod
    def map_checkpoint_name(name: str) -> str:
        """Hub layouts differ by generation: `model.visual.*` / `model.language_model.*` (Qwen3-VL and
        transformers 5 saves) and `visual.*` / `model.*` (original Qwen2.5-VL). Ours: `visual.*`, `model.*`."""
        if name.startswith("model.visual."):
            return name[len("model.") :]
        if name.startswith("model.language_model."):
            return "model." + name[len("model.language_model.") :]
        return name

    def skip_checkpoint_name(self, name: str) -> bool:
        """Tied lm_head, and KV cache scales (read by the model runner for an FP8 KV cache)."""
        if getattr(self, "towers", "all") != "all":  # EPD: the other half's tensors stay on disk
            vision = self.map_checkpoint_name(name).startswith("visual.")
            if vision != (self.towers == "vision"):
                return True
        return (self.config.tie_word_embeddings and name.startswith("lm_head.")) or is_scale_tensor(name)

    def embed_inputs(self, input_ids: torch.Tensor, forward_batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(input embeddings, deepstack embeddings or None): the runner's multimodal embedder merges
        image embeddings in; without one (text only) the token embeddings alone."""
        embedder = forward_batch.mm_embedder
        if embedder is None:
            return self.model.embed_tokens(input_ids), None
        return embedder.embed(input_ids, forward_batch, self.model.embed_tokens, self.get_image_feature,
                              self.config.text.hidden_size)

    def get_image_feature(self, items: list) -> list[torch.Tensor]:
        """Runs the vision tower once over the given images (packed) and returns one embedding matrix
        per image, (tokens, out_hidden * (1 + num_deepstack)). With `--mm-enable-dp-encoder` each TP rank
        runs its share of the images and video frame groups (balanced by patch count) and every rank gets
        all of them back."""
        if not items:
            return []
        if self.visual is None:
            raise RuntimeError("this model was built without its vision tower (--language-only): its images must "
                               "arrive as embeddings from the encoders")
        device = next(self.visual.parameters()).device
        grids = [tuple(int(v) for v in it.image_grid_thw) for it in items]
        merge2 = self.config.vision.spatial_merge_size**2
        if self.vision_dp is None:
            out = (self.vit_graph or self.visual)(self._pixels(items, device), grids)
            return list(out.split([t * h * w // merge2 for t, h, w in grids], dim=0))
        units = frame_groups(grids, self.vision_dp.size)
        unit_grids = [(n, *grids[i][1:]) for i, _, n in units]

        def encode(idx: list[int]) -> torch.Tensor:
            mine = sorted({units[k][0] for k in idx})  # each item's pixels materialized once
            start, at = {}, 0
            for i in mine:
                start[i] = at
                at += grids[i][0] * grids[i][1] * grids[i][2]
            pixels = self._pixels([items[i] for i in mine], device)
            parts = []
            for i, f0, n in (units[k] for k in idx):
                frame = grids[i][1] * grids[i][2]
                parts.append(pixels[start[i] + f0 * frame : start[i] + (f0 + n) * frame])
            tower = self.vit_graph or self.visual
            return tower(parts[0] if len(parts) == 1 else torch.cat(parts, dim=0), [unit_grids[k] for k in idx])

        width = self.config.vision.out_hidden_size * (1 + len(self.config.vision.deepstack_visual_indexes))
        per_unit = dp_encode(
            self.vision_dp, [n * h * w for n, h, w in unit_grids], [n * h * w // merge2 for n, h, w in unit_grids],
            encode, width, next(self.visual.parameters()).dtype, device,
        )
        per_item: list[list[torch.Tensor]] = [[] for _ in items]
        for (i, _, _), emb in zip(units, per_unit):
            per_item[i].append(emb)
        return [parts[0] if len(parts) == 1 else torch.cat(parts, dim=0) for parts in per_item]

    def _pixels(self, items: list, device) -> torch.Tensor:
        # SGLANG_GPU_IMAGE_DECODE (compressed JPEGs), SGLANG_MM_UINT8_PIXELS (uint8 after the resize)
        if any(isinstance(it.feature, EncodedImage) or getattr(it, "pixel_norm", None) is not None
               for it in items):
            pixels = materialize_pixels(items, device)
        else:  # compact still images (SGLANG_MM_COMPACT_STILL_IMAGES) beside full rows are widened
            pixels = concat_pixel_rows([torch.as_tensor(it.feature).to(device) for it in items])
        if self.vit_graph is not None:  # the ViT CUDA graphs were captured on full-width rows
            v = self.config.vision
            pixels = widen_still_rows(pixels, v.in_channels * v.temporal_patch_size * v.patch_size**2)
        return pixels
