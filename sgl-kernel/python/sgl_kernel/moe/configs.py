"""Tuned tile configs of the fused-MoE grouped GEMM, one JSON file per (E, N, dtype, device), in upstream
SGLang's naming and format so its published files drop in and ours go back:

    E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json
    E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json

E: the experts this rank holds (E / ep), N: each expert's intermediate size on this rank (I / (tp / ep));
device_name: torch.cuda.get_device_name() with spaces as underscores. The file maps a token count M (as a
string) to {BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}; a launch takes
the entry of the nearest M. Files are looked for in $SGLANG_MOE_CONFIG_DIR (when set), then in this
package's `configs/triton_<version>/` (none are committed: they come from a GPU run of
benchmark/kernels/fused_moe_triton/tune_fused_moe.py). No file: the fixed decode/prefill choice of
`_moe_triton.moe_block_config`, with one warning per shape (the lookup is cached, as upstream's is)."""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

# upstream's JSON keys -> the launch plan's
_KEYS = {"BLOCK_SIZE_M": "BLOCK_M", "BLOCK_SIZE_N": "BLOCK_N", "BLOCK_SIZE_K": "BLOCK_K", "GROUP_SIZE_M": "GROUP_M",
         "num_warps": "num_warps", "num_stages": "num_stages"}


def dtype_str(dtype, fp8_w8a8: bool = False) -> str | None:
    """Upstream's dtype selector: fp8_w8a8 for block-FP8 experts, float32 for float32, none for bf16/fp16."""
    import torch

    if fp8_w8a8:
        return "fp8_w8a8"
    return "float32" if dtype == torch.float32 else None


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name().replace(" ", "_") if torch.cuda.is_available() else "cpu"


def config_file_name(num_experts: int, n: int, dtype: str | None, device: str,
                     block_shape: list[int] | None = None) -> str:
    """Upstream's get_config_file_name: the dtype and block_shape selectors only when given."""
    dtype_sel = f",dtype={dtype}" if dtype else ""
    block_sel = f",block_shape={list(block_shape)}" if block_shape and all(block_shape) else ""
    return f"E={num_experts},N={n},device_name={device}{dtype_sel}{block_sel}.json"


def config_dirs() -> list[Path]:
    dirs = [Path(os.environ["SGLANG_MOE_CONFIG_DIR"])] if os.environ.get("SGLANG_MOE_CONFIG_DIR") else []
    try:  # tiles tuned under one triton version are kept apart from another's, as upstream does
        import triton
    except ImportError:
        return dirs
    version = "triton_" + triton.__version__.split("+")[0].replace(".", "_")
    return dirs + [Path(__file__).parent / "configs" / version]


def to_launch(entry: dict) -> dict:
    """One JSON entry in the launch plan's key names."""
    return {ours: int(entry[theirs]) for theirs, ours in _KEYS.items() if theirs in entry}


def to_json(config: dict) -> dict:
    return {theirs: int(config[ours]) for theirs, ours in _KEYS.items() if ours in config}


@functools.lru_cache(maxsize=None)
def load_configs(num_experts: int, n: int, dtype: str | None, device: str,
                 block_shape: tuple[int, ...] | None = None) -> dict[int, dict] | None:
    """{M: launch config} from the first tuned file found, or None after one warning (cached: once per shape)."""
    name = config_file_name(num_experts, n, dtype, device, list(block_shape) if block_shape else None)
    for d in config_dirs():
        path = d / name
        if path.is_file():
            with open(path) as f:
                table = {int(m): to_launch(v) for m, v in json.load(f).items()}
            logger.info("fused MoE: tuned configs from %s", path)
            return table
    logger.warning("fused MoE: no tuned config %s (looked in %s); using the default tiles, which may be slower. "
                   "Tune with benchmark/kernels/fused_moe_triton/tune_fused_moe.py on this GPU",
                   name, ", ".join(map(str, config_dirs())))
    return None


def pick_config(num_tokens: int, top_k: int, num_experts: int, n: int, dtype: str | None, device: str,
                block_shape: tuple[int, ...] | None = None) -> dict:
    """The tuned entry of the token count nearest num_tokens, else the default decode/prefill tiles."""
    from sgl_kernel.moe._moe_triton import moe_block_config

    table = load_configs(num_experts, n, dtype, device, block_shape)
    if not table:
        return moe_block_config(num_tokens, top_k, num_experts)
    return dict(table[min(table, key=lambda m: abs(m - num_tokens))])
