"""Safetensors files written as a stream for ``sglang.testing.make_model``: the header first (every
tensor's dtype, shape and byte range), then each tensor's blocks as the generator yields them, so no
tensor is ever whole in memory. A file is written under ``<name>.partial`` and renamed when complete:
a killed run never leaves a file that looks finished."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from sglang.testing.weight_gen import TensorSpec

_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def _write_safetensors(
    path: Path,
    specs: list[TensorSpec],
    dtype: str,
    blocks: Iterator[tuple[TensorSpec, np.ndarray]],
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Stream ``specs`` into a safetensors file, taking their encoded blocks from ``blocks`` (in
    file order; the iterator goes on into the next shard's tensors) without materializing them."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        n = s.nbytes(dtype)
        header[s.name] = {"dtype": _ST_DTYPE[dtype], "shape": list(s.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for s in specs:
            want, written = s.nbytes(dtype), 0
            while written < want:
                spec, block = next(blocks, (None, None))
                if spec is None or spec.name != s.name:
                    raise RuntimeError(f"{s.name}: got a block of {spec and spec.name} after {written} of {want} bytes")
                if sys.byteorder != "little":
                    block = block.byteswap()
                f.write(memoryview(block).cast("B"))
                written += block.nbytes
                if on_bytes is not None:
                    on_bytes(block.nbytes)
            if written != want:
                raise RuntimeError(f"{s.name}: wrote {written} bytes, expected {want}")
    os.replace(tmp, path)


def plan_shards(specs: list[TensorSpec], dtype: str, max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Greedy packing in file order; a tensor larger than the limit gets a shard of its own."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        n = s.nbytes(dtype)
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    return shards
