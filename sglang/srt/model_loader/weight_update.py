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

The cost: one host copy of this rank's weights while an update is in flight.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.loader import load_weights
from sglang.srt.model_loader.model_path import resolve_model_path
from sglang.srt.model_loader.weight_utils import iterate_weights

logger = logging.getLogger(__name__)

# upstream's load formats this loader reads (safetensors directories); others are refused by name
LOAD_FORMATS = (None, "auto", "safetensors")


class WeightUpdateError(ValueError):
    """The new weights cannot be used; the model holds the old ones."""


class StagedWeights:
    """One update on one rank: `load` (undoable), then `commit` or `restore`."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._backup: dict[str, torch.Tensor] | None = None

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
        params = dict(self.model.named_parameters())
        self._backup = {name: p.detach().to("cpu", copy=True) for name, p in params.items()}
        try:
            with torch.no_grad():
                load_weights(self.model, iterate_weights(path, lazy=True))
        except BaseException:
            self.restore()
            raise
        return path

    def restore(self) -> None:
        """The weights from before `load`, written back into the same storage."""
        if self._backup is None:
            return
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.data.copy_(self._backup[name].to(p.device))
        self._backup = None

    def commit(self) -> None:
        self._backup = None
