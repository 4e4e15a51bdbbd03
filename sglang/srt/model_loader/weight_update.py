"""Weights replaced in place from another checkpoint of the same model (`/update_weights_from_disk`).

In place: every parameter keeps its storage, so whatever holds a reference to it (CUDA graphs, tied
embeddings, fused views) sees the new values with no rebuild. Undoable: before the first tensor is written
the current parameters are copied to host memory, and a load that fails part-way (a missing file, a tensor
of another shape, a parameter the checkpoint lacks) writes them back before the error leaves. That covers
every refusal of `load_weights`: NaN/inf in a tensor (refused as it is read, before it is written), an FP8
scale off its weight's block grid, and a fused parameter missing a shard (a q/k/v or gate/up part, one
expert's linear, one `weight_scale_inv`: known only once the whole checkpoint is read). A load that
succeeded stays undoable until `commit` or `restore`: the scheduler asks every TP rank (and every
data-parallel replica) first, and the ranks that loaded restore when any other one failed, so no rank ever
serves a mix of the two weight sets.

FP8 KV cache: its per-layer scales belong to the weights they were calibrated for, so they are reloaded with
them, from where start-up reads them (`--quantization-param-path` when given, else the new checkpoint's
`k_scale` / `v_scale` tensors, 1.0 where it has none), checked before any weight is written (a scale that is
not finite, not > 0 or above MAX_KV_SCALE is refused), and restored with the weights. KV entries written under
the old scales cannot be read under the new ones: the scheduler flushes the prefix cache on commit.

The cost: one host copy of this rank's weights while an update is in flight.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.quantization.kv_cache import checkpoint_kv_scales, is_scale_tensor, param_file_kv_scales
from sglang.srt.model_loader.loader import load_weights
from sglang.srt.model_loader.model_path import resolve_model_path
from sglang.srt.model_loader.weight_utils import iterate_weights

logger = logging.getLogger(__name__)

# upstream's load formats this loader reads (safetensors directories); others are refused by name
LOAD_FORMATS = (None, "auto", "safetensors")
# an FP8 KV scale is about the absolute maximum of K or V over 448 (e4m3): 1e4 would mean activations of ~4.5e6,
# which no working checkpoint has, and it would store every ordinary entry (|x| below ~20) as zero: corrupt
MAX_KV_SCALE = 1e4


class WeightUpdateError(ValueError):
    """The new weights cannot be used; the model holds the old ones."""


def check_kv_scales(scales: dict[int, list[float]], num_layers: int, source: str) -> None:
    """Raises WeightUpdateError naming the first layer whose scale cannot be used."""
    for layer, pair in sorted(scales.items()):
        if not 0 <= layer < num_layers:
            raise WeightUpdateError(f"{source}: KV cache scales for layer {layer}; the model has {num_layers} layers")
        for which, s in zip("kv", pair):
            if not (math.isfinite(s) and 0 < s <= MAX_KV_SCALE):
                raise WeightUpdateError(f"{source}: layer {layer} {which}_scale {s!r} is not a usable FP8 KV cache "
                                        f"scale (finite, > 0 and <= {MAX_KV_SCALE:g})")


class StagedWeights:
    """One update on one rank: `load` (undoable), then `commit` or `restore`.

    `kv_pool`: the FP8 KV cache pool, whose `scales` (one (k, v) pair per layer) are reloaded with the weights;
    None for any other cache. `kv_scales_file` / `tp_rank`: `--quantization-param-path` and this rank."""

    def __init__(self, model: nn.Module, kv_pool: Any = None, kv_scales_file: str | None = None, tp_rank: int = 0):
        self.model = model
        self.kv_pool = kv_pool
        self.kv_scales_file = kv_scales_file
        self.tp_rank = tp_rank
        self._backup: dict[str, torch.Tensor] | None = None
        self._scales_backup: list | None = None

    @property
    def pending(self) -> bool:
        return self._backup is not None

    def load(self, model_path: str, load_format: str | None = None) -> str:
        """Loads `model_path`'s weights over the current ones; returns the resolved directory. Raises
        WeightUpdateError (or the loader's error) with the old weights back in place."""
        if load_format not in LOAD_FORMATS:
            raise WeightUpdateError(f"load_format {load_format!r} is not supported: use auto or safetensors")
        path = resolve_model_path(model_path)
        arch = ModelConfig.from_pretrained(path).architecture
        if arch != self.model.config.architecture:
            raise WeightUpdateError(f"{model_path} is a {arch}, the server runs a {self.model.config.architecture}")
        scales = self._read_kv_scales(path) if self.kv_pool is not None else None  # refused before any write
        params = dict(self.model.named_parameters())
        self._backup = {name: p.detach().to("cpu", copy=True) for name, p in params.items()}
        try:
            with torch.no_grad():
                load_weights(self.model, iterate_weights(path, lazy=True))
            if scales is not None:
                self._scales_backup = list(self.kv_pool.scales)
                self.kv_pool.scales = scales
        except BaseException:
            self.restore()
            raise
        return path

    def _read_kv_scales(self, path: str) -> list[tuple[float, float]]:
        """The new (k, v) scale of every layer, read as start-up reads them, and checked."""
        num_layers = len(self.kv_pool.scales)
        try:
            if self.kv_scales_file:
                source = self.kv_scales_file
                scales = param_file_kv_scales(source, self.tp_rank, num_layers)
            else:
                scales = checkpoint_kv_scales((n, t) for n, t in iterate_weights(path, lazy=True) if is_scale_tensor(n))
                source = path
        except ValueError as e:  # the file's layout, or a non-finite tensor: named by the reader
            raise WeightUpdateError(str(e)) from None
        check_kv_scales(scales, num_layers, source)
        return [tuple(scales.get(i, (1.0, 1.0))) for i in range(num_layers)]

    def restore(self) -> None:
        """The weights (and KV scales) from before `load`, written back into the same storage."""
        if self._scales_backup is not None:
            self.kv_pool.scales = self._scales_backup
            self._scales_backup = None
        if self._backup is None:
            return
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.data.copy_(self._backup[name].to(p.device))
        self._backup = None

    def commit(self) -> None:
        self._backup = None
        self._scales_backup = None
