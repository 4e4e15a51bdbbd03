"""Tests for the deterministic random-weight model generator (sglang.testing.make_model): the tiny
Qwen3-VL / Qwen2.5-VL checkpoints load in transformers, generate, and carry the right side files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sglang.testing import make_model as mm
from sglang.testing.tokenizer_builder import trained_vocab_size
from sglang.testing.hf_configs import build_config_dict
from sglang.testing.presets import LARGE_PRESETS, TINY_PRESETS, get_preset

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer, GenerationConfig  # noqa: E402

from make_model_utils import CONFIG_CLASS, MODEL_CLASS, as_loaded, hub_to_transformers  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_transformers")

IMAGE_PAD = 151655


@pytest.fixture(scope="module")
def loaded_tiny(tiny_dirs):
    out = {}
    for name, d in tiny_dirs.items():
        cls = MODEL_CLASS[get_preset(name).model_type]
        model, info = cls.from_pretrained(d, output_loading_info=True)
        out[name] = (model.eval(), info)
    return out


# ----------------------------------------------------------------------------- loading


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_tiny_loads_without_missing_or_unexpected_keys(loaded_tiny, name):
    model, info = loaded_tiny[name]
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["unexpected_keys"], info["unexpected_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    assert not info["error_msgs"]
    assert model.dtype == torch.float32
    # tied embeddings really are tied
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_loaded_weights_equal_file_and_generator(tiny_dirs, loaded_tiny, name):
    model, _ = loaded_tiny[name]
    family = get_preset(name).family
    sd = model.state_dict()
    on_disk = load_file(tiny_dirs[name] / "model.safetensors")
    assert set(on_disk) == {s.name for s in mm.tensor_specs(name)}
    for key, value in on_disk.items():
        assert torch.equal(sd[hub_to_transformers(key, family)], as_loaded(key, value)), key
    # generate_tensor reproduces the on-disk values
    for key in list(on_disk)[:5] + ["model.language_model.norm.weight" if family == "qwen3_vl" else "model.norm.weight"]:
        assert torch.equal(mm.generate_tensor(name, key), on_disk[key]), key


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_init_statistics(tiny_dirs, name):
    p = get_preset(name)
    on_disk = load_file(tiny_dirs[name] / "model.safetensors")
    for spec in mm.tensor_specs(name):
        t = on_disk[spec.name].double()
        if spec.kind == mm.NORM:
            assert abs(t.mean().item() - 1.0) < 0.1 and t.std().item() > 0.01, spec.name  # visibly not all-ones
        elif spec.kind == mm.VOCAB:
            # rows the tokenizer produces at full scale, filler rows shrunk (never-produced ids)
            n = trained_vocab_size()
            assert abs(t[:n].std().item() / p.init.embed_std - 1) < 0.1, spec.name
            filler = t[n:151643].std().item() / (p.init.embed_std * p.init.unused_vocab_scale)
            assert abs(filler - 1) < 0.1, spec.name
        elif spec.numel >= 1000:
            std = {mm.WEIGHT: p.init.weight_std, mm.EMBED: p.init.embed_std, mm.BIAS: p.init.bias_std}[spec.kind]
            assert abs(t.std().item() / std - 1) < 0.1, spec.name
            assert abs(t.mean().item()) < 0.1 * std, spec.name


def _prompt_ids(tok, text: str) -> dict:
    return tok(text, return_tensors="pt")


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_tiny_generate_text(tiny_dirs, loaded_tiny, name):
    model, _ = loaded_tiny[name]
    tok = AutoTokenizer.from_pretrained(tiny_dirs[name])
    prompts = ["Hello world", "The cat sat on the mat.", "What is in the image?", "1 2 3 4 5", "Describe a red ball."]
    outputs = []
    for prompt in prompts:
        enc = _prompt_ids(tok, prompt)
        out = model.generate(**enc, max_new_tokens=5, do_sample=False)
        gen = out[0, enc["input_ids"].shape[1] :].tolist()
        assert len(gen) == 5
        outputs.append(gen)
    all_tokens = [t for g in outputs for t in g]
    # Non-degenerate: not one token repeated everywhere; outputs depend on the prompt.
    assert len(set(all_tokens)) > 10, outputs
    assert len({tuple(g) for g in outputs}) == len(prompts), outputs
    assert sum(len(set(g)) for g in outputs) > 3 * len(prompts), outputs


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_tiny_logits_depend_on_context(loaded_tiny, name):
    model, _ = loaded_tiny[name]
    a = torch.tensor([[785, 8251, 1123, 389, 279, 5617, 13]]) % 1500
    b = a.clone()
    b[0, 0] = (b[0, 0] + 7) % 1500
    with torch.no_grad():
        la = model(input_ids=a).logits[0, -1]
        lb = model(input_ids=b).logits[0, -1]
    assert torch.isfinite(la).all()
    assert la[: trained_vocab_size()].std() > 1.0  # well-scaled logits over the real tokens
    assert (la - lb).norm() / la.norm() > 0.05  # changing the first token changes the last logits


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_tiny_generate_with_image(tiny_dirs, loaded_tiny, name):
    from PIL import Image

    model, _ = loaded_tiny[name]
    d = tiny_dirs[name]
    tok = AutoTokenizer.from_pretrained(d)
    ip = AutoImageProcessor.from_pretrained(d)
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8))
    vis = ip(images=[image], return_tensors="pt")
    merge = get_preset(name).vision.spatial_merge_size
    n_img_tokens = int(vis["image_grid_thw"].prod().item()) // merge**2
    assert n_img_tokens == 4  # 64x64 -> (4x4 patches of 16 or 4x4 patches of 14 after resize) / 2x2 merge

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this image."}]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text = text.replace("<|image_pad|>", "<|image_pad|>" * n_img_tokens)
    enc = tok(text, return_tensors="pt")
    ids = enc["input_ids"]
    assert int((ids == IMAGE_PAD).sum()) == n_img_tokens
    mm_token_type_ids = (ids == IMAGE_PAD).int()
    out = model.generate(
        input_ids=ids,
        attention_mask=enc["attention_mask"],
        pixel_values=vis["pixel_values"],
        image_grid_thw=vis["image_grid_thw"],
        mm_token_type_ids=mm_token_type_ids,
        max_new_tokens=5,
        do_sample=False,
    )
    assert out.shape[1] == ids.shape[1] + 5

    # The image matters: a different image gives different logits at the last position.
    image2 = Image.fromarray(255 - np.asarray(image))
    vis2 = ip(images=[image2], return_tensors="pt")
    with torch.no_grad():
        l1 = model(input_ids=ids, pixel_values=vis["pixel_values"], image_grid_thw=vis["image_grid_thw"],
                   mm_token_type_ids=mm_token_type_ids).logits[0, -1]
        l2 = model(input_ids=ids, pixel_values=vis2["pixel_values"], image_grid_thw=vis2["image_grid_thw"],
                   mm_token_type_ids=mm_token_type_ids).logits[0, -1]
    assert (l1 - l2).abs().max() > 1e-3


# ----------------------------------------------------------------------------- config / side files


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_side_files(tiny_dirs, name):
    p = get_preset(name)
    d = tiny_dirs[name]
    for f in ["config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json",
              "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "model.safetensors"]:
        assert (d / f).is_file(), f
    assert not (d / mm.SAFE_INDEX).exists()

    cfg = AutoConfig.from_pretrained(d)
    assert type(cfg) is CONFIG_CLASS[p.model_type]
    assert cfg.model_type == p.model_type
    assert cfg.architectures == [p.architecture]
    assert cfg.tie_word_embeddings is True
    assert (cfg.image_token_id, cfg.video_token_id) == (151655, 151656)
    assert (cfg.vision_start_token_id, cfg.vision_end_token_id) == (151652, 151653)
    tc, vc = cfg.text_config, cfg.vision_config
    assert tc.hidden_size == p.text.hidden_size and tc.num_hidden_layers == p.text.num_hidden_layers
    assert tc.rope_parameters["mrope_section"] == list(p.text.mrope_section)
    assert tc.rope_parameters["rope_theta"] == p.text.rope_theta
    assert tc.max_position_embeddings == 4096
    if p.family == "qwen3_vl":
        assert tc.rope_parameters["mrope_interleaved"] is True
        assert vc.deepstack_visual_indexes == [0, 1] and vc.num_position_embeddings == 64
    else:
        assert vc.fullatt_block_indexes == [1, 3] and vc.window_size == 112 and vc.tokens_per_second == 2
        assert tc.rms_norm_eps == 1e-6

    # transformers re-serializes our config without changing any value we wrote
    ours = json.loads((d / "config.json").read_text())
    theirs = cfg.to_dict()
    for key in ours:
        if key in ("transformers_version", "torch_dtype"):
            continue
        if key in ("text_config", "vision_config"):
            for sub, val in ours[key].items():
                # the Hub's MoE configs say num_experts; transformers 5 writes its alias num_local_experts
                sub_theirs = "num_local_experts" if sub == "num_experts" else sub
                assert theirs[key][sub_theirs] == val, (key, sub)
        else:
            assert theirs[key] == ours[key], key

    gen = GenerationConfig.from_pretrained(d)
    assert gen.bos_token_id == 151643 and gen.pad_token_id == 151643
    assert list(gen.eos_token_id) == [151645, 151643]

    ip = AutoImageProcessor.from_pretrained(d)
    assert ip.patch_size == p.vision.patch_size and ip.merge_size == 2 and ip.temporal_patch_size == 2
    assert list(ip.image_mean) == pytest.approx(list(p.image_mean))
    assert list(ip.image_std) == pytest.approx(list(p.image_std))
    pp = json.loads((d / "preprocessor_config.json").read_text())
    assert pp["image_processor_type"] == "Qwen2VLImageProcessor"
    assert pp["processor_class"] == ("Qwen3VLProcessor" if p.family == "qwen3_vl" else "Qwen2_5_VLProcessor")


@pytest.mark.parametrize("name", LARGE_PRESETS)
def test_large_preset_side_files(name):
    p = get_preset(name)
    cfg = build_config_dict(name)
    assert cfg["dtype"] == "bfloat16"
    assert cfg["text_config"]["max_position_embeddings"] == (262144 if p.family == "qwen3_vl" else 128000)
    pp = mm.build_preprocessor_config(p)
    if p.family == "qwen3_vl":
        assert pp["size"] == {"shortest_edge": 65536, "longest_edge": 16777216}
        assert pp["image_mean"] == [0.5] * 3 and pp["patch_size"] == 16
    else:
        assert pp["size"] == {"shortest_edge": 3136, "longest_edge": 12845056}
        assert pp["image_mean"] == [0.48145466, 0.4578275, 0.40821073] and pp["patch_size"] == 14
