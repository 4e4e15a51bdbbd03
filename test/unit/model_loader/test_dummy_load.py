"""`--load-format dummy`: a folder of config, tokenizer and processor files (make_model --config-only) loads
for every family and layout with every parameter filled, finite and deterministic in the seed; the
scheduler serves it the same tokens twice; an unknown architecture or load format is refused by name."""

from __future__ import annotations

import json

import pytest
import torch

from sglang.srt.model_loader.loader import get_model
from sglang.testing.make_model import write_config_only


@pytest.fixture(scope="module")
def config_dirs(tmp_path_factory):
    made = {}

    def get(preset: str, quantize: str | None = None):
        key = (preset, quantize)
        if key not in made:
            out = tmp_path_factory.mktemp(preset.replace(".", "_"))
            made[key] = write_config_only(preset, out, quantize=quantize)
        return made[key]

    return get


CASES = [("qwen3-vl-tiny", None), ("qwen3-vl-moe-tiny", None), ("qwen2.5-vl-tiny", None), ("qwen3.5-tiny", None),
         ("qwen3.5-moe-tiny", None), ("qwen3-vl-tiny", "fp8"), ("qwen3-vl-moe-tiny", "fp8"), ("qwen3.5-moe-tiny", "fp8")]


@pytest.mark.parametrize("preset,quantize", CASES, ids=[f"{p}-{q or 'bf16'}" for p, q in CASES])
def test_every_layout_loads_filled_finite_and_seeded(config_dirs, preset, quantize):
    path = str(config_dirs(preset, quantize))
    assert not list(config_dirs(preset, quantize).glob("*.safetensors"))
    a = get_model(path, dtype="float32", load_format="dummy", seed=1)
    b = get_model(path, dtype="float32", load_format="dummy", seed=1)
    c = get_model(path, dtype="float32", load_format="dummy", seed=2)
    pa, pb, pc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.isfinite(p.float()).all() for p in pa.values())
    assert all(torch.equal(pa[n], pb[n]) for n in pa), "one seed, one model"
    scales = [n for n in pa if n.endswith("_scale_inv")]
    assert all(torch.all(pa[n] == 1) for n in scales), "every FP8 block scale is 1"
    big = [n for n, p in pa.items() if p.dim() >= 2 and n not in scales]
    assert big and all(not torch.equal(pa[n], pc[n]) for n in big), "another seed, other weights"
    if quantize == "fp8":
        assert any(p.dtype == torch.float8_e4m3fn for p in pa.values()) and scales


def test_norms_start_at_identity_and_decays_are_slow(config_dirs):
    model = get_model(str(config_dirs("qwen3.5-tiny")), dtype="float32", load_format="dummy")
    params = dict(model.named_parameters())
    zero_centred = [n for n in params if n.endswith("input_layernorm.weight")]
    assert zero_centred and all(params[n].abs().max() == 0 for n in zero_centred)  # 1 + w: w = 0
    gated = [n for n in params if n.endswith("linear_attn.norm.weight")]
    assert gated and all(torch.all(params[n] == 1) for n in gated)
    assert all(torch.all(params[n] == -4) for n in params if n.endswith("dt_bias"))


def test_the_scheduler_serves_dummy_weights_the_same_tokens_twice(config_dirs):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "managers"))
    from scheduler_utils import InProcessScheduler

    path = str(config_dirs("qwen3.5-tiny"))
    outs = []
    for _ in range(2):
        s = InProcessScheduler(path, load_format="dummy", random_seed=7)
        rid = s.submit(list(range(10, 40)), None, max_new_tokens=4, ignore_eos=True)
        s.run_until_idle()
        outs.append(s.outputs[rid])
        s.assert_no_leak()
    assert outs[0] == outs[1] and len(outs[0]) == 4


def test_unknown_architecture_and_format_are_refused_by_name(config_dirs, tmp_path):
    cfg = json.loads((config_dirs("qwen3-vl-tiny") / "config.json").read_text())
    cfg["architectures"] = ["FooBarForConditionalGeneration"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(Exception, match="FooBarForConditionalGeneration"):
        get_model(str(tmp_path), load_format="dummy")
    with pytest.raises(ValueError, match="'pt' is not supported"):
        get_model(str(config_dirs("qwen3-vl-tiny")), load_format="pt")


def test_the_flag_parses_and_refuses_other_formats():
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs.from_argv(["--model-path", "x", "--load-format", "dummy"]).load_format == "dummy"
    with pytest.raises(SystemExit):
        ServerArgs.from_argv(["--model-path", "x", "--load-format", "gguf"])
