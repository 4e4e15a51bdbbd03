"""FP8 KV-cache scales as plain numbers: the range a usable scale lies in, and `--quantization-param-path`'s
JSON file (vLLM's layout: {"kv_cache": {"scaling_factor": {"<tp rank>": {"<layer>": s}}}}, one scale for K
and V) read with bounds on what reading it may cost.

No torch here, so the check before any process starts (configs/startup_checks.py) and the model runner's
loader (layers/quantization/kv_cache.py) apply one set of rules. Every refusal is a `KVScaleError`, one
line naming the file or tensor, the layer and the value.
"""

from __future__ import annotations

from sglang.srt.errors import ServeRefusal

import json
import math
import os
import stat
from typing import Any

# A scale is calibrated as amax / 448 (e4m3's largest value) of a layer's K or V, and attention folds it back
# in the model's dtype (q * k_scale, out * v_scale; layers/attention/base_attn_backend.py). 1e4 would mean K
# or V values of ~4.5e6, which no working checkpoint has (real scales are ~1e-3 .. 1e1): every entry below
# ~20 (e4m3's smallest step, 2^-9, times the scale) is stored as zero, and q * 1e4 leaves float16's range
# for any |q| > 6.5. inf or 1e308 turned every attention output into NaN. The same bound as a weight
# update's (model_loader/weight_update.py), so a scale the server starts with is one it may reload.
MAX_KV_SCALE = 1e4
# The file holds one number per layer per TP rank: 200 layers x 64 ranks is ~0.3 MiB of JSON. Past 16 MiB it
# is not a scale file (or is /dev/zero-like), and is refused before it is read into memory.
MAX_PARAM_FILE_BYTES = 16 << 20
_FLAG = "--quantization-param-path"


class KVScaleError(ServeRefusal):
    """An FP8 KV cache scale, or the file holding them, that the server cannot use; found at start-up."""


def check_scale(value: Any, where: str) -> float:
    """`value` as a float if it is a usable scale (a finite number in (0, MAX_KV_SCALE]); `where` names it
    in the refusal (a file and layer, or a checkpoint tensor)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise KVScaleError(f"{where}: the scale {value!r} is not a number")
    s = float(value)
    if not (math.isfinite(s) and 0 < s <= MAX_KV_SCALE):
        raise KVScaleError(f"{where} {s!r} is not a usable FP8 KV cache scale (finite, > 0 and <= "
                           f"{MAX_KV_SCALE:g}, the amax / 448 of K or V)")
    return s


def read_param_file(path: str, max_bytes: int = MAX_PARAM_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. Anything else is refused before a byte is read:
    a FIFO (opening it waits for a writer: start-up hung), a device such as /dev/zero (it never ends: memory
    grew by GBs), a directory. Opened without blocking and checked again on the open descriptor (the path may
    have been swapped after the stat), and at most `max_bytes` + 1 bytes are ever read (a file that grows)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise KVScaleError(f"{_FLAG} {path}: cannot be read ({e.strerror or type(e).__name__})") from None
    _check_regular(path, st, max_bytes)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise KVScaleError(f"{_FLAG} {path}: cannot be opened ({e.strerror or type(e).__name__})") from None
    try:
        _check_regular(path, os.fstat(fd), max_bytes)
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise KVScaleError(f"{_FLAG} {path}: read failed ({e.strerror or type(e).__name__})") from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise KVScaleError(f"{_FLAG} {path}: grew past {max_bytes} bytes while read; a scale file is far smaller")
    return b"".join(chunks)


def _check_regular(path: str, st: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a socket"
                if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise KVScaleError(f"{_FLAG} {path} is {kind}: give a regular JSON file of scales")
    if st.st_size > max_bytes:
        raise KVScaleError(f"{_FLAG} {path}: {st.st_size} bytes, more than the {max_bytes} a scale file may have "
                           "(one number per layer and TP rank)")


def param_file_scales(path: str, tp_rank: int, num_layers: int | None) -> dict[int, float]:
    """{layer: scale} of TP rank `tp_rank` (rank 0's when the file has none for it); every scale checked,
    every layer in [0, num_layers) when that is known. One read of the file (read_param_file)."""
    layout = '{"kv_cache": {"scaling_factor": {"<tp rank>": {"<layer>": scale}}}}'
    raw = read_param_file(path)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:  # not JSON (a UnicodeDecodeError is a ValueError)
        raise KVScaleError(f"{_FLAG} {path}: not a JSON file of scales ({type(e).__name__}); "
                           f"expected {layout}") from None
    kv = data.get("kv_cache") if isinstance(data, dict) else None
    table = kv.get("scaling_factor") if isinstance(kv, dict) else None
    if not isinstance(table, dict):
        raise KVScaleError(f"{_FLAG} {path}: no kv_cache.scaling_factor table; expected {layout}")
    rank = table.get(str(tp_rank), table.get("0"))
    if not isinstance(rank, dict):
        also = " (nor rank 0, which the other ranks fall back to)" if tp_rank else ""
        raise KVScaleError(f"{_FLAG} {path}: no scaling_factor table for TP rank {tp_rank}{also}; expected {layout}")
    scales: dict[int, float] = {}
    for layer, s in rank.items():
        try:
            k = int(layer)
        except ValueError:
            raise KVScaleError(f"{_FLAG} {path}: layer {layer[:40]!r} is not a layer number") from None
        if num_layers is not None and not 0 <= k < num_layers:
            raise KVScaleError(f"{_FLAG} {path}: layer {k} out of range: the model has {num_layers} layers")
        scales[k] = check_scale(s, f"{_FLAG} {path}: layer {k} scale")
    return scales


__all__ = ["KVScaleError", "MAX_KV_SCALE", "MAX_PARAM_FILE_BYTES", "check_scale", "param_file_scales",
           "read_param_file"]
