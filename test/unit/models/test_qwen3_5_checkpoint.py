"""The generated `qwen3.5-tiny` checkpoint (sglang.testing: presets, make_model, qwen3_5_checkpoint,
tokenizer_builder) is what transformers' Qwen3.5 loads: every tensor name and shape, no missing or
unexpected keys (the `mtp.*` head is one transformers ignores too), Qwen3.5's special token ids in the
config, generation config and tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from sglang.testing import make_model as mm
from sglang.testing.presets import get_preset, list_presets

transformers = pytest.importorskip("transformers")

PRESET = "qwen3.5-tiny"
SPECIAL = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<|vision_start|>": 248053,
           "<|vision_end|>": 248054, "<|vision_pad|>": 248055, "<|image_pad|>": 248056, "<|video_pad|>": 248057}


def test_preset_is_listed_and_cli_reuses_the_folder(tiny_model_dir, capsys):
    assert PRESET in list_presets() and get_preset(PRESET).model_type == "qwen3_5"
    path = tiny_model_dir(PRESET)
    assert mm.main(["--preset", PRESET, "--out", str(path)]) == 0
    assert capsys.readouterr().out.startswith("reused ")


def test_transformers_loads_every_tensor(tiny_model_dir):
    path = tiny_model_dir(PRESET)
    model, info = transformers.AutoModelForImageTextToText.from_pretrained(str(path), dtype=torch.float32,
                                                                           output_loading_info=True)
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    state = model.state_dict()
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        for name in names:
            if not name.startswith("mtp."):
                assert torch.equal(state[name], f.get_tensor(name)), name
    assert set(names) == {s.name for s in mm.tensor_specs(PRESET)}
    ours = {n for n in names if not n.startswith("mtp.")}
    assert ours == set(state) - {"lm_head.weight"}  # tied: not stored


def test_config_and_side_files(tiny_model_dir):
    path = tiny_model_dir(PRESET)
    cfg = transformers.AutoConfig.from_pretrained(path)
    assert (cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id) == (
        248056, 248057, 248053, 248054)
    tc = cfg.text_config
    assert tc.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert tc.rope_parameters["partial_rotary_factor"] == 0.25 and tc.rope_parameters["mrope_section"] == [2, 1, 1]
    assert tc.vocab_size == 248320 and tc.eos_token_id == 248044
    assert cfg.vision_config.deepstack_visual_indexes == []
    gen = transformers.GenerationConfig.from_pretrained(path)
    assert list(gen.eos_token_id) == [248046, 248044]
    pp = json.loads((path / "preprocessor_config.json").read_text())
    assert pp["processor_class"] == "Qwen3VLProcessor" and pp["patch_size"] == 16


def test_tokenizer_places_qwen3_5_special_ids(tiny_model_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_dir(PRESET))
    assert {t: tok.convert_tokens_to_ids(t) for t in SPECIAL} == SPECIAL
    assert len(tok) <= 248320  # every id fits the embedding
    text = "Describe the red ball, please."
    ids = tok(text)["input_ids"]
    assert max(ids) < 5000 and tok.decode(ids) == text  # trained tokens, not fillers
    chat = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                                   tokenize=False, add_generation_prompt=True)
    vision = [i for i in tok(chat)["input_ids"] if i in (248053, 248056, 248054)]
    assert vision == [248053, 248056, 248054]


def test_tiny_model_is_not_degenerate(tiny_model_dir):
    """Prompt-dependent, well-scaled logits: a parity test on a flat model would prove little."""
    model = transformers.AutoModelForImageTextToText.from_pretrained(str(tiny_model_dir(PRESET)),
                                                                     dtype=torch.float32).eval()
    a = torch.tensor([[785, 812, 1123, 389, 279, 561, 13, 90, 400, 77]])
    b = a.clone()
    b[0, 0] += 7
    with torch.no_grad():
        la, lb = model(input_ids=a).logits[0, -1], model(input_ids=b).logits[0, -1]
    assert torch.isfinite(la).all() and la[:3000].std() > 1.0
    assert (la - lb).norm() / la.norm() > 0.05  # the first token reaches the last through the DeltaNet states
