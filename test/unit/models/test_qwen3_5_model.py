"""Qwen3.5's pieces beyond the end-to-end parity (test_qwen3_5_parity.py): the config reader, which
norms are zero-centred, the gated full-attention layer with partial interleaved M-RoPE against
transformers', and loading (the MTP head skipped with a log line, a missing DeltaNet tensor refused)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from qwen3_5_driver import ListKVBackend
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_executor.forward_batch_info import ForwardMode, build_forward_batch

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

PRESET = "qwen3.5-tiny"


def _raw(tiny_model_dir) -> dict:
    return json.loads((tiny_model_dir(PRESET) / "config.json").read_text())


# ----------------------------------------------------------------------------- config


def test_config_reader(tiny_model_dir):
    cfg = ModelConfig.from_pretrained(tiny_model_dir(PRESET))
    assert cfg.architecture == "Qwen3_5ForConditionalGeneration" and cfg.model_type == "qwen3_5"
    h = cfg.text.hybrid
    assert h.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert h.linear_layers == (0, 1, 2) and h.full_attention_layers == (3,)
    assert (h.linear_num_key_heads, h.linear_num_value_heads, h.linear_key_head_dim, h.linear_value_head_dim) == (
        2, 4, 16, 16)
    assert h.conv_dim == 2 * 32 + 64 and h.rotary_dim == 8  # head_dim 32 * partial_rotary_factor 0.25
    assert cfg.text.mrope_section == (2, 1, 1) and cfg.text.mrope_interleaved
    assert cfg.vision.deepstack_visual_indexes == () and cfg.vision.patch_size == 16
    assert (cfg.image_token_id, cfg.video_token_id) == (248056, 248057)
    assert (cfg.vision_start_token_id, cfg.vision_end_token_id) == (248053, 248054)
    assert cfg.eos_token_ids == (248046, 248044) and cfg.text.vocab_size == 248320


def test_config_defaults_follow_transformers(tiny_model_dir):
    raw = _raw(tiny_model_dir)
    text = raw["text_config"]
    del text["layer_types"]
    text["full_attention_interval"] = 2
    text["rope_parameters"].pop("partial_rotary_factor")  # the top-level spelling is read then
    text["partial_rotary_factor"] = 0.5
    text["rope_parameters"]["mrope_section"] = [4, 2, 2]
    h = ModelConfig.from_dict(raw).text.hybrid
    assert h.layer_types == ("linear_attention", "full_attention") * 2
    assert h.rotary_dim == 16
    ref = transformers.Qwen3_5Config(**raw).text_config  # transformers derives the same pattern
    assert tuple(ref.layer_types) == h.layer_types


def test_mrope_section_must_cover_the_rotary_dims(tiny_model_dir):
    raw = _raw(tiny_model_dir)
    raw["text_config"]["rope_parameters"]["mrope_section"] = [8, 4, 4]  # head_dim / 2, not rotary / 2
    with pytest.raises(ValueError, match="rotary dim"):
        ModelConfig.from_dict(raw)


# ----------------------------------------------------------------------------- norms


def test_zero_centred_norms_are_where_transformers_puts_them(tiny_model_dir):
    """Decoder, final and q/k norms scale by 1 + w; the DeltaNet's gated norm by w."""
    from sglang.srt.layers.attention.fla.norm import GatedRMSNorm
    from sglang.srt.layers.layernorm import ZeroCentredRMSNorm
    from sglang.srt.models.qwen3_5 import Qwen3_5ForConditionalGeneration

    raw = _raw(tiny_model_dir)
    with torch.device("meta"):
        ref = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(**raw))
        ours = Qwen3_5ForConditionalGeneration(ModelConfig.from_dict(raw))
    kinds = {hf.Qwen3_5RMSNorm: ZeroCentredRMSNorm, hf.Qwen3_5RMSNormGated: GatedRMSNorm}
    want = {name.replace("model.language_model.", "model."): kinds[type(m)]
            for name, m in ref.named_modules() if type(m) in kinds}
    got = {name: type(m) for name, m in ours.named_modules() if type(m) in (ZeroCentredRMSNorm, GatedRMSNorm)}
    assert got == want
    assert sum(k is GatedRMSNorm for k in got.values()) == 3  # one per linear-attention layer


def test_zero_centred_norm_matches_transformers_and_differs_from_plain():
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.layernorm import ZeroCentredRMSNorm

    torch.manual_seed(0)
    ref = hf.Qwen3_5RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ref.weight.normal_(0.0, 0.3)
    ours, plain = ZeroCentredRMSNorm(16), RMSNorm(16)
    ours.weight.data.copy_(ref.weight)
    plain.weight.data.copy_(ref.weight)
    x, r = torch.randn(6, 16), torch.randn(6, 16)
    assert torch.equal(ours(x), ref(x))
    out, res = ours(x, r)
    assert torch.equal(out, ref(x + r)) and torch.equal(res, x + r)
    assert (plain(x) - ours(x)).abs().max() > 0.5  # w where 1 + w is meant: a different model


# ----------------------------------------------------------------------------- gated full attention

HEADS, KV, HD, HIDDEN = 4, 2, 32, 64


def _attention_pair(interleaved: bool = True, tp=None):
    from sglang.srt.configs.qwen3_5_config import HybridAttentionConfig
    from sglang.srt.configs.model_config import TextConfig
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding
    from sglang.srt.models.qwen3_5 import Qwen3_5Attention

    rope = {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True,
            "partial_rotary_factor": 0.25}
    config = transformers.Qwen3_5TextConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV,
                                            head_dim=HD, num_hidden_layers=1, layer_types=["full_attention"],
                                            rope_parameters=rope, vocab_size=16)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = hf.Qwen3_5Attention(config, 0).eval()
    with torch.no_grad():
        ref.q_norm.weight.normal_(0.0, 0.3)
        ref.k_norm.weight.normal_(0.0, 0.3)
    hybrid = HybridAttentionConfig(("full_attention",), 1, 1, 4, 4, 4, rotary_dim=8)
    text = TextConfig(HIDDEN, 128, 1, HEADS, KV, HD, 16, 1e-6, 10_000.0, (2, 1, 1), interleaved, 4096, False,
                      hybrid=hybrid)
    ours = Qwen3_5Attention(text, 0) if tp is None else Qwen3_5Attention(text, 0, tp)
    ours.qkv_proj.weight_loader(ours.qkv_proj.weight, ref.q_proj.weight, "q")
    ours.qkv_proj.weight_loader(ours.qkv_proj.weight, ref.k_proj.weight, "k")
    ours.qkv_proj.weight_loader(ours.qkv_proj.weight, ref.v_proj.weight, "v")
    ours.o_proj.weight_loader(ours.o_proj.weight, ref.o_proj.weight)
    ours.q_norm.weight.data.copy_(ref.q_norm.weight)
    ours.k_norm.weight.data.copy_(ref.k_norm.weight)
    return config, ref, ours, MRotaryEmbedding(8, 10_000.0, (2, 1, 1), interleaved)


def _attention_outputs(interleaved: bool, tp=None):
    t = 11
    config, ref, ours, rotary = _attention_pair(interleaved, tp)
    x = torch.randn(t, HIDDEN, generator=torch.Generator().manual_seed(1))
    # M-RoPE rows that differ (an image's t, h, w), large enough for the h and w frequencies to turn
    positions = torch.stack([torch.arange(t), torch.arange(t) * 3 % 7 + 5, torch.arange(t) * 5 % 11 + 2]) * 40
    cos, sin = hf.Qwen3_5TextRotaryEmbedding(config)(x[None], positions[:, None, :])
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        want, _ = ref(x[None], (cos, sin), mask)
        fb = build_forward_batch(ForwardMode.EXTEND, [0] * t, positions, [0], [t], torch.zeros(t, dtype=torch.int64),
                                 "cpu", extend_lens=[t], prefix_lens=[0], rids=["r"], attn_backend=ListKVBackend())
        got = ours(rotary.cos_sin(positions, x.dtype), x, fb)
    return got, want[0]


def test_gated_attention_matches_transformers():
    got, want = _attention_outputs(interleaved=True)
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5


def test_sectioned_mrope_would_not_match():
    """The comparison above sees the M-RoPE layout: sectioned (Qwen2.5-VL's) frequencies differ."""
    got, want = _attention_outputs(interleaved=False)
    assert ((got - want).abs().max() / want.abs().max()).item() > 1e-3


def test_gated_attention_tensor_parallel_shards_sum_to_the_whole(monkeypatch):
    """Two ranks (o_proj's all-reduce replaced by the partial sums) add up to one: a rank's rows of the
    fused projection are whole (query, gate) head pairs and its kv head."""
    import sglang.srt.layers.linear as linear
    from sglang.srt.distributed.parallel_state import TPInfo

    whole, _ = _attention_outputs(interleaved=True)
    monkeypatch.setattr(linear, "tensor_model_parallel_all_reduce", lambda y, tp: y)
    total = sum(_attention_outputs(True, TPInfo(rank=r, size=2))[0] for r in range(2))
    assert ((total - whole).abs().max() / whole.abs().max()).item() <= 1e-5


# ----------------------------------------------------------------------------- loading


def test_mtp_head_is_skipped_with_one_log_line(tiny_model_dir, caplog):
    from safetensors import safe_open

    from sglang.srt.model_loader.loader import get_model

    path = tiny_model_dir(PRESET)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        mtp = [k for k in f.keys() if k.startswith("mtp.")]
    assert len(mtp) >= 10  # the released MTP block: fc, three norms, one full-attention layer
    with caplog.at_level(logging.INFO, logger="sglang.srt.models.qwen3_5"):
        model = get_model(str(path), dtype="float32")
    lines = [r for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert len(lines) == 1 and model._skipped_mtp == len(mtp)
    assert not any(n.startswith("mtp") for n, _ in model.named_parameters())


def test_missing_deltanet_tensor_is_refused(tiny_model_dir):
    from sglang.srt.model_loader.loader import MissingWeightsError, load_weights
    from sglang.srt.model_loader.weight_utils import iterate_weights
    from sglang.srt.models.qwen3_5 import Qwen3_5ForConditionalGeneration

    path = tiny_model_dir(PRESET)
    model = Qwen3_5ForConditionalGeneration(ModelConfig.from_pretrained(path))
    gone = "model.language_model.layers.1.linear_attn.A_log"
    with pytest.raises(MissingWeightsError, match="layers.1.linear_attn.A_log"):
        load_weights(model, ((n, t) for n, t in iterate_weights(str(path)) if n != gone))
