"""Reading checkpoint tensors from safetensors files (single file or sharded with an index)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open


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


def iterate_weights(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) lazily, one tensor in memory at a time (beyond what the model keeps)."""
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
