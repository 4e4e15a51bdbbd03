"""Model configuration parsed from an HF-format `config.json`, independent of transformers.

Accepts both the transformers 5.x layout (`rope_parameters`) and the older one (`rope_scaling` +
`rope_theta`), so real downloaded checkpoints and our generated replicas load the same way.
"""

from __future__ import annotations

from sglang.srt.errors import ServeRefusal

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang.srt.configs.qwen3_5_config import (
    HYBRID_MODEL_TYPES,
    QWEN3_5_ARCH,
    QWEN3_5_MOE_ARCH,
    QWEN3_5_MOE_MODEL_TYPE,
    HybridAttentionConfig,
    parse_hybrid_attention,
)

QWEN3_VL_ARCH = "Qwen3VLForConditionalGeneration"
QWEN3_VL_MOE_ARCH = "Qwen3VLMoeForConditionalGeneration"
QWEN2_5_VL_ARCH = "Qwen2_5_VLForConditionalGeneration"
_MODEL_TYPE_TO_ARCH = {"qwen3_vl": QWEN3_VL_ARCH, "qwen3_vl_moe": QWEN3_VL_MOE_ARCH, "qwen2_5_vl": QWEN2_5_VL_ARCH,
                       "qwen3_5": QWEN3_5_ARCH, QWEN3_5_MOE_MODEL_TYPE: QWEN3_5_MOE_ARCH}
# model types whose vision tower is Qwen3-VL's and whose M-RoPE is interleaved (Qwen3.5: without deepstack)
_QWEN3_VISION_TYPES = ("qwen3_vl", "qwen3_vl_moe", *HYBRID_MODEL_TYPES)
_ARCH_TO_MODEL_TYPE = {arch: model_type for model_type, arch in _MODEL_TYPE_TO_ARCH.items()}


class ModelConfigError(ServeRefusal):
    """A config.json this engine refuses to serve, found while it is read (so at start-up, before any
    request); the message is one line naming the field and its value."""


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10000.0
    # Qwen3-VL
    num_position_embeddings: int = 0
    deepstack_visual_indexes: tuple[int, ...] = ()
    # Qwen2.5-VL
    window_size: int = 0
    fullatt_block_indexes: tuple[int, ...] = ()
    tokens_per_second: float = 2.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class MoEConfig:
    """The sparse MLP of a MoE text decoder (Qwen3-VL-MoE field names)."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # Qwen3.5-MoE: one shared expert of this width beside the routed ones, its output scaled per token by
    # sigmoid(shared_expert_gate(x)); 0: none (Qwen3-VL-MoE)
    shared_expert_intermediate_size: int = 0

    def is_sparse_layer(self, layer_id: int) -> bool:
        """A layer gets experts unless listed in mlp_only_layers or off the decoder_sparse_step grid."""
        return layer_id not in self.mlp_only_layers and (layer_id + 1) % self.decoder_sparse_step == 0


@dataclass(frozen=True)
class TextConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    max_position_embeddings: int
    attention_bias: bool
    hidden_act: str = "silu"
    moe: MoEConfig | None = None  # None: every layer has a dense MLP
    hybrid: HybridAttentionConfig | None = None  # Qwen3.5: linear-attention layers; None: all full attention


@dataclass(frozen=True)
class ModelConfig:
    path: str
    architecture: str
    model_type: str
    text: TextConfig
    vision: VisionConfig
    tie_word_embeddings: bool
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str = "float32"
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_qwen3_vl(self) -> bool:
        """Qwen3-VL and Qwen3-VL-MoE: the same vision tower, deepstack and M-RoPE."""
        return self.model_type in ("qwen3_vl", "qwen3_vl_moe")

    @property
    def context_length(self) -> int:
        return self.text.max_position_embeddings

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        with open(path / "config.json") as f:
            raw = json.load(f)
        eos: tuple[int, ...] = ()
        gen_path = path / "generation_config.json"
        if gen_path.exists():
            with open(gen_path) as f:
                gen_eos = json.load(f).get("eos_token_id")
            if gen_eos is not None:
                eos = tuple(gen_eos) if isinstance(gen_eos, list) else (gen_eos,)
        return cls.from_dict(raw, str(path), eos)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], path: str = "", eos: tuple[int, ...] = ()) -> "ModelConfig":
        model_type = raw.get("model_type", "")
        archs = raw.get("architectures") or [_MODEL_TYPE_TO_ARCH.get(model_type, "")]
        arch = archs[0]
        if arch not in _ARCH_TO_MODEL_TYPE:
            raise ValueError(
                f"unsupported architecture {arch!r} (model_type {model_type!r}); "
                f"supported: {', '.join(_ARCH_TO_MODEL_TYPE)}"
            )
        model_type = _ARCH_TO_MODEL_TYPE[arch]
        text_raw = raw.get("text_config") or raw  # old Qwen2.5-VL configs are flat
        text = _parse_text(text_raw, model_type)
        vision = _parse_vision(raw["vision_config"], model_type)
        if not eos:
            e = text_raw.get("eos_token_id", raw.get("eos_token_id"))
            eos = tuple(e) if isinstance(e, list) else ((e,) if e is not None else ())
        tie = raw.get("tie_word_embeddings", text_raw.get("tie_word_embeddings", False))
        dtype = raw.get("dtype") or raw.get("torch_dtype") or text_raw.get("dtype") or "float32"
        return cls(
            path=path,
            architecture=arch,
            model_type=model_type,
            text=text,
            vision=vision,
            tie_word_embeddings=bool(tie),
            image_token_id=raw.get("image_token_id", 151655),
            video_token_id=raw.get("video_token_id", 151656),
            vision_start_token_id=raw.get("vision_start_token_id", 151652),
            vision_end_token_id=raw.get("vision_end_token_id", 151653),
            eos_token_ids=eos,
            torch_dtype=str(dtype),
            raw=raw,
        )


def _rope_params(cfg: dict[str, Any]) -> dict[str, Any]:
    params = dict(cfg.get("rope_parameters") or {})
    legacy = cfg.get("rope_scaling") or {}
    for k, v in legacy.items():
        params.setdefault(k, v)
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    return params


def _count(key: str, value: Any) -> int:
    """A count of the text config as an int; a bool, a fraction or a non-number is refused naming it."""
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ModelConfigError(f"config.json: text_config.{key} must be a whole number, got {value!r}")
    return int(value)


def _parse_moe(cfg: dict[str, Any]) -> MoEConfig:
    """The experts of a MoE text config. Each token's router takes the top `num_experts_per_tok` of
    `num_experts`, so 1 <= top-k <= experts is checked here, where the config is read: past it the router
    cannot pick (every request failed, while the server looked healthy), and a MoE model without experts
    has no MLP to run."""
    # transformers 5 writes num_local_experts (num_experts is its alias); the Hub configs num_experts
    key = next((k for k in ("num_experts", "num_local_experts") if cfg.get(k) is not None), "num_experts")
    experts = _count(key, cfg.get(key, 0))
    if experts < 1:
        raise ModelConfigError(f"config.json: a mixture-of-experts model needs text_config.{key} >= 1, got {experts}")
    if "num_experts_per_tok" not in cfg:
        raise ModelConfigError("config.json: text_config.num_experts_per_tok (experts per token) is missing")
    top_k = _count("num_experts_per_tok", cfg["num_experts_per_tok"])
    if not 1 <= top_k <= experts:
        raise ModelConfigError(f"config.json: text_config.num_experts_per_tok {top_k} must be between 1 and the "
                               f"model's {experts} experts (text_config.{key}): each token is routed to that many")
    step = cfg.get("decoder_sparse_step", 1) or 1
    return MoEConfig(
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=cfg["moe_intermediate_size"],
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        decoder_sparse_step=int(step),
        mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
    )


def _parse_qwen3_5_moe(cfg: dict[str, Any]) -> MoEConfig:
    """Qwen3.5-MoE's experts, as transformers 5.24 runs them: every decoder layer is sparse (its text
    config has no dense intermediate_size; a config asking for dense layers is refused, not half-served),
    the router always renormalizes its top-k weights (the releases carry no norm_topk_prob, and
    transformers ignores one), and each layer has one shared expert."""
    step = cfg.get("decoder_sparse_step", 1) or 1
    if cfg.get("mlp_only_layers") or step != 1:
        raise ModelConfigError(f"config.json: Qwen3.5-MoE has experts in every layer; text_config asks for dense "
                               f"layers (mlp_only_layers {cfg.get('mlp_only_layers')}, decoder_sparse_step {step})")
    key = "shared_expert_intermediate_size"
    if key not in cfg:
        raise ModelConfigError(f"config.json: text_config.{key} (the shared expert's width) is missing")
    shared = _count(key, cfg[key])
    if shared < 1:
        raise ModelConfigError(f"config.json: text_config.{key} must be >= 1, got {shared}")
    moe = _parse_moe(cfg)
    return MoEConfig(moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size, norm_topk_prob=True,
                     shared_expert_intermediate_size=shared)


def _parse_text(cfg: dict[str, Any], model_type: str) -> TextConfig:
    rope = _rope_params(cfg)
    qwen3 = model_type in _QWEN3_VISION_TYPES
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    hybrid = parse_hybrid_attention(cfg, rope, head_dim) if model_type in HYBRID_MODEL_TYPES else None
    if model_type == QWEN3_5_MOE_MODEL_TYPE:
        moe = _parse_qwen3_5_moe(cfg)
        # no dense MLP: the width one token's MLP computes (shared expert + its k routed experts), which is
        # what the memory budget sizes an MLP's transients by
        intermediate = moe.shared_expert_intermediate_size + moe.num_experts_per_tok * moe.moe_intermediate_size
    else:
        moe = _parse_moe(cfg) if model_type == "qwen3_vl_moe" else None
        intermediate = cfg["intermediate_size"]
    rotary_dim = hybrid.rotary_dim if hybrid is not None else head_dim
    section = tuple(rope.get("mrope_section") or ())
    if not section:
        raise ValueError("text config has no mrope_section: not a Qwen-VL M-RoPE model")
    if sum(section) != rotary_dim // 2:
        raise ValueError(f"mrope_section {section} must sum to the rotary dim // 2 = {rotary_dim // 2}")
    return TextConfig(
        hidden_size=cfg["hidden_size"],
        intermediate_size=intermediate,
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads", heads),
        head_dim=head_dim,
        vocab_size=cfg["vocab_size"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope["rope_theta"]),
        mrope_section=section,
        mrope_interleaved=bool(rope.get("mrope_interleaved", qwen3)),
        max_position_embeddings=cfg.get("max_position_embeddings", 32768),
        # Qwen2-style text models always carry q/k/v biases; Qwen3 ones carry none.
        attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2_5_vl")),
        hidden_act=cfg.get("hidden_act", "silu"),
        moe=moe,
        hybrid=hybrid,
    )


def _parse_vision(cfg: dict[str, Any], model_type: str) -> VisionConfig:
    rope = _rope_params(cfg)
    hidden = cfg.get("hidden_size") or cfg.get("embed_dim")
    qwen3 = model_type in _QWEN3_VISION_TYPES
    default_act = "gelu_pytorch_tanh" if qwen3 else "silu"
    return VisionConfig(
        depth=cfg["depth"],
        hidden_size=hidden,
        intermediate_size=cfg["intermediate_size"],
        num_heads=cfg["num_heads"],
        out_hidden_size=cfg.get("out_hidden_size") or cfg["hidden_size"],
        patch_size=cfg.get("patch_size", 16 if qwen3 else 14),
        temporal_patch_size=cfg.get("temporal_patch_size", 2),
        spatial_merge_size=cfg.get("spatial_merge_size", 2),
        in_channels=cfg.get("in_channels", cfg.get("in_chans", 3)),
        hidden_act=cfg.get("hidden_act", default_act),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        num_position_embeddings=cfg.get("num_position_embeddings", 0),
        deepstack_visual_indexes=tuple(cfg.get("deepstack_visual_indexes") or ()),
        window_size=cfg.get("window_size", 0),
        fullatt_block_indexes=tuple(cfg.get("fullatt_block_indexes") or ()),
        tokens_per_second=float(cfg.get("tokens_per_second", 2.0)),
    )
