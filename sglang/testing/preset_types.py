"""The shapes a preset is made of (vision tower, text decoder, MoE, init scheme, the whole preset) and the
family names and special token ids they use; the presets themselves are in presets.py. Nothing here
imports torch or transformers."""

from __future__ import annotations

from dataclasses import dataclass, field

QWEN3_VL = "qwen3_vl"
QWEN2_5_VL = "qwen2_5_vl"

IMAGE_TOKEN_ID = 151655
VIDEO_TOKEN_ID = 151656
VISION_START_TOKEN_ID = 151652
VISION_END_TOKEN_ID = 151653
BOS_TOKEN_ID = 151643  # <|endoftext|>
IM_END_TOKEN_ID = 151645
PAD_TOKEN_ID = 151643

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

QWEN3_VL_MOE = "qwen3_vl_moe"  # a model_type of the qwen3_vl family (same tokenizer, vision tower)
QWEN3_5 = "qwen3_5"
QWEN3_5_MOE = "qwen3_5_moe"  # a model_type of the qwen3_5 family (a qwen3_5 preset with TextPreset.moe set)
_ARCH = {QWEN3_VL: "Qwen3VLForConditionalGeneration", QWEN2_5_VL: "Qwen2_5_VLForConditionalGeneration",
         QWEN3_VL_MOE: "Qwen3VLMoeForConditionalGeneration", QWEN3_5: "Qwen3_5ForConditionalGeneration",
         QWEN3_5_MOE: "Qwen3_5MoeForConditionalGeneration"}

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class VisionPreset:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    hidden_act: str
    patch_size: int
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    # Qwen3-VL only
    num_position_embeddings: int | None = None
    deepstack_visual_indexes: tuple[int, ...] = ()
    # Qwen2.5-VL only
    window_size: int | None = None
    fullatt_block_indexes: tuple[int, ...] = ()
    tokens_per_second: int | None = None


@dataclass(frozen=True)
class MoEPreset:
    """Sparse MLPs (Qwen3-VL-MoE). Experts are written fused, as released: ``mlp.experts.gate_up_proj``
    [E, hidden, 2*inter] (gate columns, then up) and ``mlp.experts.down_proj`` [E, inter, hidden]."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse_layer(self, layer_id: int) -> bool:
        return layer_id not in self.mlp_only_layers and (layer_id + 1) % self.decoder_sparse_step == 0


@dataclass(frozen=True)
class SharedExpertMoEPreset(MoEPreset):
    """Qwen3.5-MoE's sparse MLPs (qwen3_5_checkpoint.py): every layer sparse, experts fused as released
    ([E, 2*inter, hidden], [E, hidden, inter]), plus one shared expert of this width. A subclass, so the
    Qwen3-VL-MoE presets' definitions (and the digests make_model keys its reuse on) stay as they were."""

    shared_expert_intermediate_size: int = field(kw_only=True)


@dataclass(frozen=True)
class TextPreset:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    moe: MoEPreset | None = None


@dataclass(frozen=True)
class InitScheme:
    """How random values are drawn (all normal, per tensor)."""

    weight_std: float = 0.02  # linear / conv weights
    embed_std: float = 0.02  # token embedding, lm_head, vision pos_embed
    bias_std: float = 0.02
    norm_noise_std: float = 0.02  # norm weights are 1 + N(0, norm_noise_std)
    unused_vocab_scale: float = 0.05  # std factor for token ids the tokenizer never produces


@dataclass(frozen=True)
class ModelPreset:
    name: str
    family: str  # QWEN3_VL or QWEN2_5_VL
    vision: VisionPreset
    text: TextPreset
    tie_word_embeddings: bool
    default_dtype: str
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int
    init: InitScheme = field(default_factory=InitScheme)
    tiny: bool = False

    @property
    def model_type(self) -> str:
        if self.text.moe is None:
            return self.family
        return QWEN3_5_MOE if self.family == QWEN3_5 else QWEN3_VL_MOE

    @property
    def architecture(self) -> str:
        return _ARCH[self.model_type]

    @property
    def is_qwen3(self) -> bool:
        return self.family == QWEN3_VL
