"""`--load-format dummy` (upstream's flag): weights made on the target device from config.json alone.

For measuring at full size (decode step time, ViT MFU, serving throughput on a 235B replica) without
writing or reading a checkpoint: a full-depth 8B model in bfloat16 is 16 GB of safetensors, minutes to
write and read; here the parameters are filled where they live, in seconds. The outputs are meaningless
(random weights) but stable: each parameter is drawn from its own generator seeded by (seed, name) on its
own device, so one seed, one config and one TP layout give the same weights and the same tokens.

Values keep a random model numerically tame, as make_model's do: linear and embedding weights N(0, 0.02),
biases 0, norms at their identity (1, or 0 for the zero-centred `1 + w` norms), FP8 block scales 1 (the
e4m3 weight holds the N(0, 0.02) value itself), Gated DeltaNet decays slow (`A_log` 0, `dt_bias` -4).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from sglang.srt.layers.layernorm import ZeroCentredRMSNorm

WEIGHT_STD = 0.02
DEFAULT_SEED = 1234  # upstream's dummy-weight seed

# parameter leaf name -> constant fill (checked before the generic rules); every FP8 block scale (a leaf ending
# in `_scale_inv`: linears' weight_scale_inv, fused experts' gate_up_proj_scale_inv / down_proj_scale_inv) is 1
_CONSTANTS = {"A_log": 0.0, "dt_bias": -4.0}
_SCALE_SUFFIX = "_scale_inv"


def _param_seed(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def _norm_fill(module: nn.Module) -> float | None:
    """The identity value of a norm module's weight, or None when the module is not a norm."""
    if isinstance(module, ZeroCentredRMSNorm):
        return 0.0
    if "norm" in type(module).__name__.lower():
        return 1.0
    return None


@torch.no_grad()
def fill_dummy_weights(model: nn.Module, seed: int = DEFAULT_SEED) -> int:
    """Fills every parameter of `model` in place on its device; returns how many were filled."""
    owner = {}
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            owner[f"{mod_name}.{p_name}" if mod_name else p_name] = module
    count = 0
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        module = owner[name]
        norm = _norm_fill(module) if leaf == "weight" else None
        if leaf.endswith(_SCALE_SUFFIX):
            param.fill_(1.0)
        elif leaf in _CONSTANTS:
            param.fill_(_CONSTANTS[leaf])
        elif norm is not None:
            param.fill_(norm)
        elif leaf == "bias" or param.dim() < 2:
            param.zero_()
        else:
            gen = torch.Generator(device=param.device).manual_seed(_param_seed(seed, name))
            values = torch.randn(param.shape, generator=gen, device=param.device, dtype=torch.float32)
            param.copy_(values.mul_(WEIGHT_STD).to(param.dtype))  # FP8 weights: the cast saturates nothing here
        count += 1
    return count
