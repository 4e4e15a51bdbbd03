"""Builds a model from an HF-format directory: config -> module -> weights (name mapping, fused
parameters, TP slicing through each parameter's `weight_loader`, tied embeddings, dtype)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.errors import ServeRefusal
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.quantization import quantization_config
from sglang.srt.model_loader.weight_utils import LazyWeight, iterate_weights, materialize
from sglang.srt.models.registry import get_model_class

logger = logging.getLogger(__name__)
LOAD_FORMATS = ("auto", "safetensors", "dummy")  # --load-format: the checkpoint's safetensors, or dummy weights

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype, config: ModelConfig) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        dtype = config.torch_dtype.replace("torch.", "")
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use one of auto, {', '.join(_DTYPES)}") from None


class MissingWeightsError(ServeRefusal, KeyError):
    """The checkpoint leaves parameters, or shards of fused ones, unfilled. (str() is the message itself,
    not KeyError's repr of it.)"""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _shards_filled(required: frozenset | None, shard_id) -> set:
    """The shards of a parameter requiring `required` (its `required_shards`) that one
    `weight_loader(param, tensor, shard_id)` call filled.

    A parameter without `required_shards` is one tensor: any call fills it ({None}). shard_id None is a
    fused tensor, which a fused layer's loader accepts only at its full shape: it fills every shard. A
    shard id outside `required_shards` (another rank's expert, skipped by the layer) fills nothing, so
    a shard delivered twice counts once and never for another."""
    if required is None:
        return {None}
    if shard_id is None:
        return set(required)
    return {shard_id} if shard_id in required else set()


def _shard_source(model: nn.Module, name: str, shard) -> str:
    """The checkpoint-side name of shard `shard` of our parameter `name` (stacked_params_mapping backwards)."""
    for fused, part, sid in model.stacked_params_mapping:
        if fused in name and sid == shard:
            return f" ({name.replace(fused, part)})"
    return ""


def _check_complete(model: nn.Module, params: dict[str, nn.Parameter], filled: dict[str, set]) -> None:
    """Raises MissingWeightsError naming every parameter the checkpoint never filled and every required
    shard of a fused one it left out (up to 10 of each)."""
    absent, partial = [], []
    for name, param in params.items():
        if getattr(param, "loaded_by_process", False):  # filled after loading (--quantization fp8 scales)
            continue
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        if name not in filled:
            absent.append(name)
            continue
        required = getattr(param, "required_shards", None)
        for shard in required or ():
            if shard not in filled[name]:
                partial.append(f"{name} shard {shard!r}{_shard_source(model, name, shard)}")
    if not absent and not partial:
        return
    more = lambda xs: f" ... and {len(xs) - 10} more" if len(xs) > 10 else ""  # noqa: E731
    lines = []
    if partial:
        lines.append(f"checkpoint is missing {'; '.join(partial[:10])}{more(partial)}")
    if absent:
        lines.append(f"parameters not found in checkpoint: {sorted(absent)[:10]}{more(absent)}")
    raise MissingWeightsError("; ".join(lines))


def load_weights(model: nn.Module, weights) -> set[str]:
    """Loads (checkpoint name, tensor) pairs into `model`; returns the parameter names filled.

    Raises on a checkpoint tensor with no home, on NaN/inf in any tensor read (weight_utils.LazyWeight
    checks each region as it is read, before it reaches a parameter), and, once all are read, on
    parameters (or shards of fused parameters: q/k/v, gate/up, each expert, each FP8 scale) the
    checkpoint never filled: a silently random weight is the worst failure a loader can have."""
    params = dict(model.named_parameters())
    # as sets once: a 128-expert parameter is filled by 256 calls, each looking its shard up
    required = {n: frozenset(p.required_shards) for n, p in params.items() if hasattr(p, "required_shards")}
    filled: dict[str, set] = {}  # parameter -> the shards of it delivered (see _shards_filled)
    for ckpt_name, tensor in weights:
        if model.skip_checkpoint_name(ckpt_name):
            continue
        name = model.map_checkpoint_name(ckpt_name)
        shard_id = None
        for fused, part, sid in model.stacked_params_mapping:
            if part in name:
                name, shard_id = name.replace(part, fused), sid
                break
        param = params.get(name)
        if param is None:
            raise KeyError(f"checkpoint tensor {ckpt_name!r} (mapped to {name!r}) matches no model parameter")
        if not isinstance(tensor, LazyWeight):  # one read path: named, and checked for NaN/inf when read
            tensor = LazyWeight.of(tensor, ckpt_name)
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            if loader is not None:
                loader(param, tensor, shard_id)
            else:
                if tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(f"{ckpt_name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                param.data.copy_(materialize(tensor).to(param.dtype))
        filled.setdefault(name, set()).update(_shards_filled(required.get(name), shard_id))
    _check_complete(model, params, filled)
    return set(filled)


def get_model(
    model_path: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    tp: TPInfo = SINGLE_RANK,
    vit: ViTStrategy | None = None,
    quantization: str | None = None,
    load_format: str = "auto",
    seed: int | None = None,
) -> nn.Module:
    """`vit` None resolves the vision-tower switches from the environment here, once per model built
    (`ViTStrategy.from_env`); the model and its layers only see the resolved strategy. `quantization`:
    `--quantization` (a checkpoint's own quantization_config applies whatever it says). `load_format`:
    `auto`/`safetensors` read the checkpoint; `dummy` fills the weights on `device` from config.json
    alone (model_loader/dummy.py; `seed`: its seed)."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"--load-format {load_format!r} is not supported; use one of {', '.join(LOAD_FORMATS)}")
    config = ModelConfig.from_pretrained(model_path)
    torch_dtype = resolve_dtype(dtype, config)
    cls = get_model_class(config.architecture)
    quant = quantization_config(config.raw, quantization)
    if vit is None:
        vit = ViTStrategy.from_env()
    with torch.device(device):
        model = cls(config, tp=tp, dtype=torch_dtype, vit=vit, quant=quant)
    if load_format == "dummy":
        from sglang.srt.model_loader.dummy import DEFAULT_SEED, fill_dummy_weights

        fill_dummy_weights(model, DEFAULT_SEED if seed is None else seed)
    else:
        load_weights(model, iterate_weights(model_path, lazy=True))
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    logger.info("loaded %s from %s%s (%s%s, tp %d/%d): %.2f GiB of weights on this rank", config.architecture,
                model_path, " with DUMMY weights (--load-format dummy: outputs are meaningless)" if load_format == "dummy"
                else "", torch_dtype, f", {quant.describe()}" if quant else "", tp.rank, tp.size, weight_bytes / 2**30)
    if (vit.ulysses_sp or vit.dp_encoder) and tp.size > 1:
        log_replicated_vision_memory(model, tp, "vit-ulysses-sp" if vit.ulysses_sp else "mm-dp-encoder")
    return model.eval()


def log_replicated_vision_memory(model: nn.Module, tp: TPInfo, what: str = "vit-ulysses-sp") -> str:
    """--enable-vit-ulysses-sp / --mm-enable-dp-encoder: the vision tower is whole on every rank; say what
    that costs."""
    nbytes = sum(p.numel() * p.element_size() for p in model.visual.parameters())
    line = (
        f"{what}: vision tower weights replicated on each of {tp.size} ranks: {nbytes / 2**20:.1f} MiB "
        f"per rank ({nbytes / tp.size / 2**20:.1f} MiB when TP-sharded, +{nbytes * (tp.size - 1) / tp.size / 2**20:.1f} MiB)"
    )
    logger.info(line)
    return line
