"""Builds a model from an HF-format directory: config -> module -> weights (name mapping, fused
parameters, TP slicing through each parameter's `weight_loader`, tied embeddings, dtype)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.quantization import quantization_config
from sglang.srt.model_loader.weight_utils import iterate_weights, materialize
from sglang.srt.models.registry import get_model_class

logger = logging.getLogger(__name__)

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


def load_weights(model: nn.Module, weights) -> set[str]:
    """Loads (checkpoint name, tensor) pairs into `model`; returns the parameter names filled.

    Raises on a checkpoint tensor with no home and on parameters the checkpoint never filled:
    a silently random weight is the worst failure a loader can have."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
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
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            if loader is not None:
                loader(param, tensor, shard_id)
            else:
                if tuple(param.shape) != tuple(tensor.shape):
                    raise ValueError(f"{ckpt_name}: checkpoint shape {tuple(tensor.shape)} != {tuple(param.shape)}")
                param.data.copy_(materialize(tensor).to(param.dtype))
        loaded.add(name)
    # filled after loading from what was loaded (--quantization fp8 scales), not from the checkpoint
    missing = {n for n in set(params) - loaded if not getattr(params[n], "loaded_by_process", False)}
    if model.config.tie_word_embeddings:
        missing.discard("lm_head.weight")
    if missing:
        raise KeyError(f"parameters not found in checkpoint: {sorted(missing)[:10]}{' ...' if len(missing) > 10 else ''}")
    return loaded


def get_model(
    model_path: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    tp: TPInfo = SINGLE_RANK,
    vit: ViTStrategy | None = None,
    quantization: str | None = None,
) -> nn.Module:
    """`vit` None resolves the vision-tower switches from the environment here, once per model built
    (`ViTStrategy.from_env`); the model and its layers only see the resolved strategy. `quantization`:
    `--quantization` (a checkpoint's own quantization_config applies whatever it says)."""
    config = ModelConfig.from_pretrained(model_path)
    torch_dtype = resolve_dtype(dtype, config)
    cls = get_model_class(config.architecture)
    quant = quantization_config(config.raw, quantization)
    if vit is None:
        vit = ViTStrategy.from_env()
    with torch.device(device):
        model = cls(config, tp=tp, dtype=torch_dtype, vit=vit, quant=quant)
    load_weights(model, iterate_weights(model_path, lazy=True))
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    logger.info("loaded %s from %s (%s%s, tp %d/%d): %.2f GiB of weights on this rank", config.architecture, model_path,
                torch_dtype, f", {quant.describe()}" if quant else "", tp.rank, tp.size, weight_bytes / 2**30)
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
