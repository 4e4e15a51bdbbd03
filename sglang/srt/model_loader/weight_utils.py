"""Reading checkpoint tensors from safetensors files (single file or sharded with an index), handed to the
layers as `layers.checkpoint_tensor.LazyWeight`s (checked for NaN/inf as each region is read)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from sglang.srt.layers.checkpoint_tensor import (  # noqa: F401  (also this module's names)
    LazyWeight,
    NonFiniteWeightError,
    check_finite,
    has_non_finite,
    materialize,
    tensor_name,
)


def safetensors_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    return files


def iterate_weights(model_dir: str | Path, lazy: bool = False) -> Iterator[tuple[str, torch.Tensor | LazyWeight]]:
    """Yields (name, tensor) one at a time; with `lazy`, (name, LazyWeight) whose bytes are read only
    for the region finally loaded."""
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if lazy:
                    sl = f.get_slice(name)
                    yield name, LazyWeight(sl, tuple(sl.get_shape()), name=name)
                else:
                    yield name, f.get_tensor(name)
