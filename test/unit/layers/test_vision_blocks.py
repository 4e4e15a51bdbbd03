"""Linear patch embedding (SGLANG_VIT_PATCH_EMBED_LINEAR) against the baseline Conv3d: same outputs on
the same checkpoint tensor, and the 5-D conv weight reshaped at load (eager and lazily read); compact still-image
rows (SGLANG_MM_COMPACT_STILL_IMAGES) against the kernel folded over time."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from sglang.srt.layers.vision_blocks import Conv3dPatchEmbed, LinearPatchEmbed, fold_temporal, make_patch_embed
from sglang.srt.model_loader.weight_utils import iterate_weights

# (patch, temporal, channels, embed, bias): Qwen3-VL and Qwen2.5-VL layouts, and an odd one
SHAPES = [(16, 2, 3, 64, True), (14, 2, 3, 48, False), (4, 1, 2, 8, True)]


def _pair(patch, temporal, channels, embed, bias, seed=0):
    """A baseline Conv3d module and a Linear module loaded from the same (conv-shaped) tensors."""
    g = torch.Generator().manual_seed(seed)
    conv = Conv3dPatchEmbed(patch, temporal, channels, embed, bias, dtype=torch.float32)
    lin = LinearPatchEmbed(patch, temporal, channels, embed, bias, dtype=torch.float32)
    ckpt = {"proj.weight": torch.randn(embed, channels, temporal, patch, patch, generator=g) * 0.05}
    if bias:
        ckpt["proj.bias"] = torch.randn(embed, generator=g)
    conv.load_state_dict(ckpt)
    for name, p in lin.named_parameters():
        p.weight_loader(p, ckpt[name])
    return conv, lin, ckpt


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("n", [1, 7, 300])
def test_linear_equals_conv3d_float32(shape, n):
    conv, lin, _ = _pair(*shape)
    patch, temporal, channels = shape[:3]
    x = torch.randn(n, channels * temporal * patch * patch, generator=torch.Generator().manual_seed(n))
    with torch.no_grad():
        ref, out = conv(x), lin(x)
    assert out.shape == ref.shape == (n, shape[3])
    assert _rel(out, ref) <= 1e-5


def test_input_dtype_is_cast_like_the_baseline():
    conv, lin, _ = _pair(*SHAPES[0])
    x = torch.randn(5, 3 * 2 * 16 * 16, dtype=torch.float64)
    with torch.no_grad():
        assert lin(x).dtype == conv(x).dtype == torch.float32
        assert _rel(lin(x), conv(x)) <= 1e-5


def test_weight_is_the_flattened_conv_weight():
    conv, lin, ckpt = _pair(*SHAPES[0])
    assert lin.proj.weight.shape == (64, 3 * 2 * 16 * 16)
    assert torch.equal(lin.proj.weight, ckpt["proj.weight"].reshape(64, -1))
    assert torch.equal(lin.proj.bias, ckpt["proj.bias"])


def test_lazy_checkpoint_tensor_loads(tmp_path):
    """The loader hands over LazyWeight objects; the reshape must read them first."""
    _, ref, ckpt = _pair(*SHAPES[1])
    save_file({f"patch_embed.{k}": v.contiguous() for k, v in ckpt.items()}, str(tmp_path / "model.safetensors"))
    lin = LinearPatchEmbed(14, 2, 3, 48, bias=False, dtype=torch.float32)
    for name, w in iterate_weights(tmp_path, lazy=True):
        assert type(w).__name__ == "LazyWeight"
        lin.proj.weight.weight_loader(lin.proj.weight, w)
    assert torch.equal(lin.proj.weight, ref.proj.weight)


def test_already_flat_checkpoint_weight_loads():
    _, ref, ckpt = _pair(*SHAPES[2])
    lin = LinearPatchEmbed(4, 1, 2, 8, bias=True, dtype=torch.float32)
    lin.proj.weight.weight_loader(lin.proj.weight, ckpt["proj.weight"].reshape(8, -1))
    assert torch.equal(lin.proj.weight, ref.proj.weight)


@pytest.mark.parametrize("bad", [(64, 3, 2, 16, 8), (32, 3, 2, 16, 16)])
def test_mismatched_conv_weight_fails_loudly(bad):
    lin = LinearPatchEmbed(16, 2, 3, 64, bias=True, dtype=torch.float32)
    with pytest.raises(ValueError, match="patch_embed"):
        lin.proj.weight.weight_loader(lin.proj.weight, torch.zeros(bad))


def test_switch_off_builds_the_baseline_module_with_the_same_parameter_names():
    off = make_patch_embed(False, 16, 2, 3, 64, bias=True)
    on = make_patch_embed(True, 16, 2, 3, 64, bias=True)
    assert type(off) is Conv3dPatchEmbed and isinstance(off.proj, torch.nn.Conv3d)
    assert type(on) is LinearPatchEmbed
    assert [n for n, _ in off.named_parameters()] == [n for n, _ in on.named_parameters()]
    assert sum(p.numel() for p in off.parameters()) == sum(p.numel() for p in on.parameters())


# ---------------------------------------------------------------------- compact still images
def _pair_frames(x: torch.Tensor, channels: int, temporal: int) -> torch.Tensor:
    """Compact rows (one frame) repeated over the temporal patch: the baseline's rows of a still image."""
    n, w = x.shape
    return x.view(n, channels, 1, w // channels).expand(n, channels, temporal, w // channels).reshape(n, -1)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s[1] > 1], ids=lambda s: "x".join(map(str, s)))
def test_one_frame_against_the_folded_kernel_equals_the_pair(shape):
    """SGLANG_MM_COMPACT_STILL_IMAGES: a compact row (C*P*P) embeds like its duplicated pair (C*T*P*P),
    through both modules (within float32 rounding: the sum moves from the input to the kernel)."""
    conv, lin, _ = _pair(*shape)
    patch, temporal, channels = shape[:3]
    x = torch.randn(9, channels * patch * patch, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = conv(_pair_frames(x, channels, temporal))
        for module in (conv, lin):
            assert module(x).shape == ref.shape
            assert _rel(module(x), ref) <= 1e-5


def test_the_folded_kernel_is_the_sum_over_time():
    conv, lin, ckpt = _pair(*SHAPES[0])
    w = ckpt["proj.weight"]
    assert torch.equal(fold_temporal(conv.proj.weight, 3, 2), (w[:, :, 0] + w[:, :, 1]).unsqueeze(2))
    assert torch.equal(fold_temporal(lin.proj.weight, 3, 2), (w[:, :, 0] + w[:, :, 1]).reshape(64, -1))


def test_the_folded_kernel_follows_a_weight_update():
    """Folded from the live weight on every call: a weight update (in place) is seen at once."""
    _, lin, _ = _pair(*SHAPES[0])
    x = torch.randn(4, 3 * 16 * 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        before = lin(x)
        lin.proj.weight.mul_(2.0)
        after = lin(x)
        assert _rel(after - lin.proj.bias, 2 * (before - lin.proj.bias)) <= 1e-6


@pytest.mark.parametrize("width", [3 * 16 * 16 + 1, 3 * 16 * 16 * 4, 3 * 16 * 8])
def test_other_row_widths_are_refused(width):
    conv, lin, _ = _pair(*SHAPES[0])
    for module in (conv, lin):
        with pytest.raises(ValueError, match="patch_embed: pixel rows of shape"):
            module(torch.zeros(2, width))
