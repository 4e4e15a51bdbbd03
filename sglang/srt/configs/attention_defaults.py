"""What `auto` attention means on a device: the one rule shared by the server's flags and a ModelRunner
built directly (benchmarks, tests, sglang.Engine's workers)."""

from __future__ import annotations

import importlib.util


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec("sgl_kernel") is not None


def default_attention_backends(device: str) -> tuple[str, str]:
    """(language model, vision tower) attention for `auto`: our Triton kernels on CUDA; elsewhere the
    pure-torch paths (Triton runs on CPU only interpreted: for tests, when asked for). The torch paths on
    CUDA are far slower: SDPA picks cuDNN, which plans again for every new context length (8.8 ms of host
    time per decode call, seen on an H200)."""
    on_cuda = device.startswith("cuda") and triton_importable()
    return ("triton", "triton") if on_cuda else ("torch_native", "sdpa")
