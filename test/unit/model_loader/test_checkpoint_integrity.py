"""A checkpoint loads whole or not at all: a fused parameter needs every shard (q/k/v, gate/up, each
expert's linears, each FP8 `weight_scale_inv`), an FP8 scale must have its weight's block grid, and no
weight or scale may hold NaN/inf. `get_model` refuses such a checkpoint naming the tensor, and an
update from one (/update_weights_from_disk) is refused with every old weight bit-for-bit in place.

Each bad checkpoint is the seed-1 tiny checkpoint rewritten with one change; updates start from the
seed-0 model, so a half-applied update could not hide behind equal values."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang.srt.model_loader.loader import get_model
from sglang.srt.model_loader.weight_update import StagedWeights
from sglang.testing.make_model import make_model

L = "model.language_model.layers"  # checkpoint names; the model's own are model.layers.*
DENSE, FP8, MOE, MOE_FP8 = ("qwen3-vl-tiny", None), ("qwen3-vl-tiny", "fp8"), ("qwen3-vl-moe-tiny", None), \
    ("qwen3-vl-moe-tiny", "fp8")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(preset, quantize, seed) -> directory, each built once for the module."""
    built: dict[tuple, Path] = {}

    def get(kind: tuple[str, str | None], seed: int = 0) -> Path:
        if (kind, seed) not in built:
            preset, quant = kind
            out = tmp_path_factory.mktemp(f"{preset}-{quant}-{seed}".replace(".", "_"))
            built[kind, seed] = Path(make_model(preset, out / "model", seed=seed, progress=False, quantize=quant))
        return built[kind, seed]

    return get


@pytest.fixture(scope="module")
def bad_checkpoint(checkpoint, tmp_path_factory):
    """case -> the seed-1 checkpoint of its kind with the case's edit, each written once for the module."""
    built: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in built:
            kind, edit, _, _ = CASES[case]
            built[case] = variant(checkpoint(kind, seed=1), tmp_path_factory.mktemp("bad") / case, edit)
        return built[case]

    return get


def variant(src: Path, dst: Path, edit) -> Path:
    """A copy of checkpoint `src` in `dst` with `edit(tensors)` applied to each safetensors file's dict."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, dst / f.name)
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(str(f))
        edit(tensors)
        save_file(tensors, str(dst / f.name), metadata={"format": "pt"})
    return dst


def drop(name: str):
    def edit(t):
        assert name in t, name
        del t[name]

    return edit


def reshape(name: str, shape: tuple[int, ...]):
    def edit(t):
        assert name in t, name
        t[name] = torch.ones(shape, dtype=t[name].dtype)

    return edit


def poison(name: str, value: float, index: tuple[int, ...]):
    """Sets one element to `value` (NaN/inf); e4m3 tensors get the raw byte `value` (0x7F / 0xFF are NaN)."""

    def edit(t):
        x = t[name].clone()
        if x.dtype == torch.float8_e4m3fn:
            x.view(torch.uint8)[index] = int(value)
        else:
            x[index] = value
        t[name] = x

    return edit


NAN, INF = float("nan"), float("inf")
# id: (checkpoint kind, edit, error type, what the message must say)
CASES = {
    "missing-k_proj": (DENSE, drop(f"{L}.1.self_attn.k_proj.weight"), KeyError,
                       "model.layers.1.self_attn.qkv_proj.weight shard 'k' (model.layers.1.self_attn.k_proj.weight)"),
    "missing-up_proj": (DENSE, drop(f"{L}.0.mlp.up_proj.weight"), KeyError,
                        "model.layers.0.mlp.gate_up_proj.weight shard 1 (model.layers.0.mlp.up_proj.weight)"),
    "missing-q_proj-fp8": (FP8, drop(f"{L}.2.self_attn.q_proj.weight"), KeyError,
                                     "model.layers.2.self_attn.qkv_proj.weight shard 'q'"),
    "missing-expert-up": (MOE_FP8, drop(f"{L}.0.mlp.experts.3.up_proj.weight"), KeyError,
                          "model.layers.0.mlp.experts.gate_up_proj shard (3, 1) "
                          "(model.layers.0.mlp.experts.3.up_proj.weight)"),
    "missing-expert-down": (MOE_FP8, drop(f"{L}.1.mlp.experts.7.down_proj.weight"), KeyError,
                            "model.layers.1.mlp.experts.down_proj shard (7, None)"),
    "missing-scale-v": (FP8, drop(f"{L}.0.self_attn.v_proj.weight_scale_inv"), KeyError,
                        "model.layers.0.self_attn.qkv_proj.weight_scale_inv shard 'v' "
                        "(model.layers.0.self_attn.v_proj.weight_scale_inv)"),
    "missing-scale-gate": (FP8, drop(f"{L}.1.mlp.gate_proj.weight_scale_inv"), KeyError,
                           "model.layers.1.mlp.gate_up_proj.weight_scale_inv shard 0"),
    "missing-expert-scale": (MOE_FP8, drop(f"{L}.3.mlp.experts.0.gate_proj.weight_scale_inv"), KeyError,
                             "model.layers.3.mlp.experts.gate_up_proj_scale_inv shard (0, 0) "
                             "(model.layers.3.mlp.experts.0.gate_proj.weight_scale_inv)"),
    "scale-shape-o_proj": (FP8, reshape(f"{L}.0.self_attn.o_proj.weight_scale_inv", (1, 2)), ValueError,
                           f"{L}.0.self_attn.o_proj.weight_scale_inv"),
    "scale-shape-k_proj": (FP8, reshape(f"{L}.2.self_attn.k_proj.weight_scale_inv", (2, 1)), ValueError,
                           f"{L}.2.self_attn.k_proj.weight_scale_inv"),
    "scale-shape-expert": (MOE_FP8, reshape(f"{L}.1.mlp.experts.2.down_proj.weight_scale_inv", (2, 1)), ValueError,
                           f"{L}.1.mlp.experts.2.down_proj.weight_scale_inv"),
    "scale-shape-expert-up": (MOE_FP8, reshape(f"{L}.0.mlp.experts.5.up_proj.weight_scale_inv", (1, 3)), ValueError,
                              f"{L}.0.mlp.experts.5.up_proj.weight_scale_inv"),
    "nan-up_proj": (DENSE, poison(f"{L}.0.mlp.up_proj.weight", NAN, (5, 7)), ValueError, f"{L}.0.mlp.up_proj.weight"),
    "inf-final-norm": (DENSE, poison("model.language_model.norm.weight", -INF, (3,)), ValueError,
                       "model.language_model.norm.weight"),
    "nan-vision-qkv": (DENSE, poison("model.visual.blocks.0.attn.qkv.weight", NAN, (40, 1)), ValueError,
                       "model.visual.blocks.0.attn.qkv.weight"),
    "nan-fused-expert": (MOE, poison(f"{L}.0.mlp.experts.gate_up_proj", NAN, (5, 3, 7)), ValueError,
                         f"{L}.0.mlp.experts.gate_up_proj"),
    "nan-e4m3-0x7f": (FP8, poison(f"{L}.1.self_attn.q_proj.weight", 0x7F, (9, 9)), ValueError,
                      f"{L}.1.self_attn.q_proj.weight"),
    "nan-e4m3-0xff-expert": (MOE_FP8, poison(f"{L}.0.mlp.experts.6.gate_proj.weight", 0xFF, (0, 0)), ValueError,
                             f"{L}.0.mlp.experts.6.gate_proj.weight"),
    "nan-scale": (FP8, poison(f"{L}.0.mlp.down_proj.weight_scale_inv", NAN, (0, 0)), ValueError,
                  f"{L}.0.mlp.down_proj.weight_scale_inv"),
    "inf-expert-scale": (MOE_FP8, poison(f"{L}.3.mlp.experts.1.up_proj.weight_scale_inv", INF, (0, 0)), ValueError,
                         f"{L}.3.mlp.experts.1.up_proj.weight_scale_inv"),
}


def _raises(case: str):
    _, _, err, words = CASES[case]
    return pytest.raises(err, match=re.escape(words))


def _bits(model) -> dict[str, torch.Tensor]:
    """Every parameter's bytes (bit equality, whatever the dtype: e4m3 has no torch.equal on CPU)."""
    return {n: p.detach().contiguous().view(torch.uint8).clone() for n, p in model.named_parameters()}


def _assert_bit_equal(before: dict[str, torch.Tensor], model) -> None:
    after = _bits(model)
    assert after.keys() == before.keys()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert not changed, f"weights changed: {changed[:5]}"


@pytest.mark.parametrize("case", list(CASES))
def test_get_model_refuses_the_checkpoint_naming_the_tensor(case, bad_checkpoint):
    with _raises(case):
        get_model(str(bad_checkpoint(case)))


@pytest.mark.parametrize("case", list(CASES))
def test_an_update_from_it_is_refused_and_every_old_weight_stays(case, checkpoint, bad_checkpoint):
    model = get_model(str(checkpoint(CASES[case][0])))
    before = _bits(model)
    staged = StagedWeights(model)
    with _raises(case):
        staged.load(str(bad_checkpoint(case)))
    assert not staged.pending
    _assert_bit_equal(before, model)


@pytest.mark.parametrize("kind", [DENSE, FP8, MOE, MOE_FP8], ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_good_update_applies_and_restores_bit_equal(kind, checkpoint):
    """The control for the refusals above: the seed-1 checkpoint does change every text weight, and its
    update is the model get_model builds from it."""
    model = get_model(str(checkpoint(kind)))
    before = _bits(model)
    staged = StagedWeights(model)
    staged.load(str(checkpoint(kind, seed=1)))
    want = _bits(get_model(str(checkpoint(kind, seed=1))))
    got = _bits(model)
    assert all(torch.equal(got[n], want[n]) for n in want)
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    assert not torch.equal(got[qkv], before[qkv])
    staged.restore()
    _assert_bit_equal(before, model)
