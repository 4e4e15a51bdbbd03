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


class LazyWeight:
    """A checkpoint tensor not yet read: `narrow` and `split` only narrow the region to read, so a
    TP rank that loads its shard reads just those bytes from disk. `load()` reads the region."""

    def __init__(self, sl, shape: tuple[int, ...], region: tuple[tuple[int, int], ...] | None = None):
        self._slice = sl
        self._full_shape = tuple(shape)
        self._region = region or tuple((0, n) for n in shape)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(e - s for s, e in self._region)

    def dim(self) -> int:
        return len(self._full_shape)

    def narrow(self, dim: int, start: int, length: int) -> "LazyWeight":
        dim = dim % self.dim()
        s, e = self._region[dim]
        if start < 0 or start + length > e - s:
            raise IndexError(f"narrow({dim}, {start}, {length}) out of range for shape {tuple(self.shape)}")
        region = list(self._region)
        region[dim] = (s + start, s + start + length)
        return LazyWeight(self._slice, self._full_shape, tuple(region))

    def split(self, sizes: list[int], dim: int = 0) -> list["LazyWeight"]:
        out, start = [], 0
        for n in sizes:
            out.append(self.narrow(dim, start, n))
            start += n
        return out

    def load(self) -> torch.Tensor:
        return self._slice[tuple(slice(s, e) for s, e in self._region)]


def materialize(w) -> torch.Tensor:
    return w.load() if isinstance(w, LazyWeight) else w


def iterate_weights(model_dir: str | Path, lazy: bool = False) -> Iterator[tuple[str, torch.Tensor | LazyWeight]]:
    """Yields (name, tensor) one at a time; with `lazy`, (name, LazyWeight) whose bytes are read only
    for the region finally loaded."""
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if lazy:
                    sl = f.get_slice(name)
                    yield name, LazyWeight(sl, tuple(sl.get_shape()))
                else:
                    yield name, f.get_tensor(name)
