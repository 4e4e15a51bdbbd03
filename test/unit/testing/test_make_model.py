"""Tests for the deterministic random-weight model generator (sglang.testing.make_model)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sglang.testing import make_model as mm
from sglang.testing.tokenizer_builder import trained_vocab_size
from sglang.testing.hf_configs import build_config_dict
from sglang.testing.presets import LARGE_PRESETS, PRESETS, TINY_PRESETS, get_preset

transformers = pytest.importorskip("transformers")
from transformers import (  # noqa: E402
    AutoConfig,
    AutoImageProcessor,
    AutoTokenizer,
    GenerationConfig,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
# keyed by model_type: qwen3_vl_moe is a model type of the qwen3_vl family
MODEL_CLASS = {"qwen3_vl": Qwen3VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
               "qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration}
CONFIG_CLASS = {"qwen3_vl": Qwen3VLConfig, "qwen2_5_vl": Qwen2_5_VLConfig, "qwen3_vl_moe": Qwen3VLMoeConfig}
IMAGE_PAD = 151655


@pytest.fixture(autouse=True)
def _quiet_transformers():
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    yield


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tiny_models")
    return {name: mm.make_model(name, base / name, progress=False) for name in TINY_PRESETS}


@pytest.fixture(scope="module")
def loaded_tiny(tiny_dirs):
    out = {}
    for name, d in tiny_dirs.items():
        cls = MODEL_CLASS[get_preset(name).model_type]
        model, info = cls.from_pretrained(d, output_loading_info=True)
        out[name] = (model.eval(), info)
    return out


def _file_hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def _as_loaded(name: str, value):
    """transformers 5 transposes Qwen3-VL-MoE's fused experts on load ([E, in, out] -> [E, out, in])."""
    if ".mlp.experts." in name:
        return value.transpose(1, 2) if hasattr(value, "transpose") else (value[0], value[2], value[1])
    return value


def _hub_to_transformers(name: str, family: str) -> str:
    """transformers 5.x key renaming: Qwen2.5-VL Hub keys `visual.*` / `model.*` are loaded
    as `model.visual.*` / `model.language_model.*`; Qwen3-VL Hub keys are used as is."""
    if family == "qwen2_5_vl":
        name = re.sub(r"^visual\.", "model.visual.", name)
        name = re.sub(r"^model\.(?!visual\.|language_model\.)", "model.language_model.", name)
    return name


def _meta_model(preset_name: str):
    p = get_preset(preset_name)
    config = CONFIG_CLASS[p.model_type](**build_config_dict(p))
    with torch.device("meta"):
        model = MODEL_CLASS[p.model_type](config)
    return p, config, model


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
        assert torch.equal(sd[_hub_to_transformers(key, family)], _as_loaded(key, value)), key
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


# ----------------------------------------------------------------------------- names, shapes, counts


@pytest.mark.parametrize("name", list(PRESETS))
def test_names_and_shapes_match_transformers(name):
    p, config, model = _meta_model(name)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if p.tie_word_embeddings:
        expected.pop("lm_head.weight")  # tied: not stored in the checkpoint
    ours = {_hub_to_transformers(s.name, p.family): _as_loaded(s.name, s.shape) for s in mm.tensor_specs(name)}
    assert len(ours) == len(mm.tensor_specs(name))  # renaming is injective
    assert set(ours) == set(expected), (set(ours) ^ set(expected))
    for k, shape in ours.items():
        assert shape == expected[k], k
    # unique parameter count (tied lm_head counted once) == our enumeration
    n_meta = sum(prm.numel() for prm in model.parameters())  # parameters() de-duplicates tied weights
    assert n_meta == mm.count_parameters(name)
    assert config.tie_word_embeddings == p.tie_word_embeddings


def test_qwen3_vl_4b_param_count():
    assert mm.count_parameters("qwen3-vl-4b") == 4_437_815_808
    assert mm.count_parameters("qwen3-vl-4b", "vision") == 415_347_712
    _, _, model = _meta_model("qwen3-vl-4b")
    assert sum(p.numel() for p in model.parameters()) == 4_437_815_808
    assert sum(p.numel() for p in model.model.visual.parameters()) == 415_347_712


def test_known_param_counts():
    # Parameter counts of the public checkpoints (the MoE ones: 31.1B and 235.7B on their Hub pages).
    assert mm.count_parameters("qwen3-vl-2b") == 2_127_532_032
    assert mm.count_parameters("qwen3-vl-8b") == 8_767_123_696
    assert mm.count_parameters("qwen2.5-vl-3b") == 3_754_622_976
    assert mm.count_parameters("qwen2.5-vl-7b") == 8_292_166_656
    assert mm.count_parameters("qwen3-vl-30b-a3b") == 31_070_754_032
    assert mm.count_parameters("qwen3-vl-235b-a22b") == 235_670_022_896


def test_moe_presets_write_the_released_fused_experts():
    specs = {s.name: s.shape for s in mm.tensor_specs("qwen3-vl-30b-a3b")}
    pre = "model.language_model.layers.47.mlp"
    assert specs[f"{pre}.experts.gate_up_proj"] == (128, 2048, 1536)
    assert specs[f"{pre}.experts.down_proj"] == (128, 768, 2048)
    assert specs[f"{pre}.gate.weight"] == (128, 2048)
    assert not any(".mlp.gate_proj." in n for n in specs)  # every layer sparse
    tc = build_config_dict("qwen3-vl-30b-a3b")["text_config"]
    assert (tc["num_experts"], tc["num_experts_per_tok"], tc["moe_intermediate_size"]) == (128, 8, 768)
    assert tc["norm_topk_prob"] is True and tc["decoder_sparse_step"] == 1 and tc["mlp_only_layers"] == []
    from sglang.testing.presets import with_text_layers

    short = {s.name for s in mm.tensor_specs(with_text_layers("qwen3-vl-30b-a3b", 4))}
    assert "model.language_model.layers.3.mlp.experts.down_proj" in short
    assert not any(".layers.4." in n for n in short)
    # the dense presets keep their manifest digest (folders made before MoE presets are still reused)
    import dataclasses

    from sglang.testing.model_manifest import _canonical, preset_digest

    dense = dataclasses.asdict(get_preset("qwen3-vl-tiny"))
    dense["text"].pop("moe")
    assert preset_digest(get_preset("qwen3-vl-tiny")) == hashlib.sha256(_canonical(dense)).hexdigest()[:16]


@pytest.mark.parametrize("name", LARGE_PRESETS)
def test_large_preset_shard_plan(name):
    p = get_preset(name)
    specs = mm.tensor_specs(name)
    shards = mm.plan_shards(specs, "bfloat16", mm.DEFAULT_MAX_SHARD_BYTES)
    assert [s for shard in shards for s in shard] == specs
    # a tensor over the limit (235B's fused experts, 3.2 GB) gets a shard of its own; the rest pack
    small = sum(s.numel * 2 for s in specs if s.numel * 2 <= mm.DEFAULT_MAX_SHARD_BYTES)
    assert len(shards) >= -(-small // mm.DEFAULT_MAX_SHARD_BYTES) and len(shards) > 1
    for shard in shards:
        size = sum(s.numel * 2 for s in shard)
        assert size <= mm.DEFAULT_MAX_SHARD_BYTES or len(shard) == 1
    assert p.default_dtype == "bfloat16"


# ----------------------------------------------------------------------------- determinism


def test_same_seed_identical_bytes(tmp_path, tiny_dirs):
    name = "qwen3-vl-tiny"
    again = mm.make_model(name, tmp_path / "again", progress=False)
    ref = {k: v for k, v in _file_hashes(tiny_dirs[name]).items()}
    assert _file_hashes(again) == ref


def test_same_seed_identical_bytes_across_processes(tmp_path, tiny_dirs):
    name = "qwen2.5-vl-tiny"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONHASHSEED="12345")
    out = tmp_path / "cli"
    r = subprocess.run(
        [sys.executable, "-m", "sglang.testing.make_model", "--preset", name, "--out", str(out), "--seed", "0"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert _file_hashes(out) == _file_hashes(tiny_dirs[name])


def test_different_seed_differs(tmp_path, tiny_dirs):
    name = "qwen3-vl-tiny"
    other = mm.make_model(name, tmp_path / "seed1", seed=1, progress=False)
    a, b = _file_hashes(tiny_dirs[name]), _file_hashes(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    assert a["config.json"] == b["config.json"] and a["tokenizer.json"] == b["tokenizer.json"]
    w0 = load_file(tiny_dirs[name] / "model.safetensors")
    w1 = load_file(other / "model.safetensors")
    for k in w0:
        assert not torch.equal(w0[k], w1[k]), k


def test_tensor_seed_stable():
    # sha256-based, independent of PYTHONHASHSEED and of the process
    assert mm.tensor_seed(0, "lm_head.weight") == int.from_bytes(
        hashlib.sha256(b"0:lm_head.weight").digest()[:16], "little"
    )
    assert mm.tensor_seed(0, "a") != mm.tensor_seed(1, "a") != mm.tensor_seed(0, "b")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_dtypes_match_torch_rounding(tmp_path, tiny_dirs, dtype):
    name = "qwen2.5-vl-tiny"
    d = mm.make_model(name, tmp_path / dtype, dtype=dtype, progress=False)
    tdt = getattr(torch, dtype)
    half = load_file(d / "model.safetensors")
    full = load_file(tiny_dirs[name] / "model.safetensors")
    for k, v in full.items():
        assert half[k].dtype == tdt
        assert torch.equal(half[k], v.to(tdt)), k
    assert json.loads((d / "config.json").read_text())["dtype"] == dtype
    model, info = Qwen2_5_VLForConditionalGeneration.from_pretrained(d, output_loading_info=True)
    assert model.dtype == tdt and not info["missing_keys"] and not info["unexpected_keys"]


def test_bf16_conversion_exact():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 3
    x[:4] = [0.0, -0.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8]  # ties round to even
    ours = torch.from_numpy(mm._float32_to_bf16_bits(x).view(np.int16)).view(torch.bfloat16)
    assert torch.equal(ours, torch.from_numpy(x).to(torch.bfloat16))


# ----------------------------------------------------------------------------- sharding


def test_sharded_output_loads_and_matches(tmp_path, tiny_dirs):
    name = "qwen3-vl-tiny"
    shard_limit = 4_000_000  # force several shards (the embedding alone is ~39 MB -> own shard)
    d = mm.make_model(name, tmp_path / "sharded", max_shard_bytes=shard_limit, progress=False)
    assert not (d / "model.safetensors").exists()
    index = json.loads((d / mm.SAFE_INDEX).read_text())
    shard_files = sorted(p.name for p in d.glob("model-*-of-*.safetensors"))
    n = len(shard_files)
    assert n >= 3
    assert shard_files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert set(index["weight_map"].values()) == set(shard_files)
    specs = mm.tensor_specs(name)
    assert set(index["weight_map"]) == {s.name for s in specs}
    assert index["metadata"]["total_size"] == sum(s.numel * 4 for s in specs)

    merged = {}
    for f in shard_files:
        with safe_open(str(d / f), framework="pt") as sf:
            keys = list(sf.keys())
            assert all(index["weight_map"][k] == f for k in keys)
            size = sum(sf.get_tensor(k).numel() * 4 for k in keys)
            assert size <= shard_limit or len(keys) == 1
            merged.update({k: sf.get_tensor(k) for k in keys})
    single = load_file(tiny_dirs[name] / "model.safetensors")
    assert merged.keys() == single.keys()
    for k in single:
        assert torch.equal(merged[k], single[k]), k

    model, info = Qwen3VLForConditionalGeneration.from_pretrained(d, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    sd = model.state_dict()
    for k, v in single.items():
        assert torch.equal(sd[k], v), k

    # Re-generating unsharded into the same dir removes the stale shards.
    mm.make_model(name, d, progress=False)
    assert not list(d.glob("model-*-of-*.safetensors")) and not (d / mm.SAFE_INDEX).exists()
    assert _file_hashes(d)["model.safetensors"] == _file_hashes(tiny_dirs[name])["model.safetensors"]


# ----------------------------------------------------------------------------- cache


def test_ensure_model_cache(tmp_path, tiny_dirs):
    cache = tmp_path / "cache"
    path = mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache, progress=False)
    assert path == cache / "qwen2.5-vl-tiny-seed0"
    assert _file_hashes(path) == _file_hashes(tiny_dirs["qwen2.5-vl-tiny"])
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not regenerated
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temp dirs left behind

    # A stale/foreign directory (wrong stamp) is replaced.
    (path / mm.STAMP_FILE).write_text("{}")
    assert mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache, progress=False) == path
    assert json.loads((path / mm.STAMP_FILE).read_text())["preset"] == "qwen2.5-vl-tiny"
    assert [p.name for p in cache.iterdir()] == [path.name]

    other = mm.ensure_model("qwen2.5-vl-tiny", cache_dir=cache, seed=3, dtype="bfloat16", progress=False)
    assert other.name == "qwen2.5-vl-tiny-seed3-bfloat16"


def test_ensure_model_env_default(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_MODEL_CACHE", str(tmp_path / "envcache"))
    assert mm.default_cache_dir() == tmp_path / "envcache"
    monkeypatch.delenv("SGLANG_MODEL_CACHE")
    assert mm.default_cache_dir() == Path("~/.cache/sglang/models").expanduser()


def test_cli_list_and_errors(capsys):
    assert mm.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-vl-4b" in out and "4,437,815,808" in out
    with pytest.raises(SystemExit):
        mm.main(["--preset", "qwen3-vl-tiny"])  # --out missing
    with pytest.raises(ValueError):
        mm.make_model("qwen3-vl-tiny", "/nonexistent-unused", dtype="int8")


def test_a_short_replica_keeps_every_width_and_the_vision_tower():
    from sglang.testing.hf_configs import build_config_dict
    from sglang.testing.presets import get_preset, with_text_layers

    full = get_preset("qwen3-vl-4b")
    short = with_text_layers(full, 4)
    assert short.name == "qwen3-vl-4b-4l" and short.text.num_hidden_layers == 4
    assert short.vision == full.vision and short.text == replace(full.text, num_hidden_layers=4)
    cfg = build_config_dict(short, "bfloat16")
    assert cfg["text_config"]["num_hidden_layers"] == 4 and cfg["vision_config"]["depth"] == full.vision.depth
    assert with_text_layers(full, full.text.num_hidden_layers) is full
    with pytest.raises(ValueError, match="3..36 text layers"):  # one per deepstack level at least
        with_text_layers(full, 2)
