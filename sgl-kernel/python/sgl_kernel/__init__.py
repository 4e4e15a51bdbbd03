"""Our own Triton kernels for the sglang serving engine, grouped by domain in submodules.

The package imports without triton. Callers ask :func:`triton_available` before taking a Triton path
and fall back to the pure-torch implementation otherwise. Kernels are tested on CPU by running them
under the Triton interpreter (``TRITON_INTERPRET=1``) on float32 tensors, and on CUDA by the tests
marked ``gpu``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

__all__ = ["pick_backend", "triton_available"]

__version__ = "0.1.0"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def triton_available() -> bool:
    """True when Triton kernels can run here.

    That needs triton to import and either a CUDA device or the Triton interpreter
    (``TRITON_INTERPRET=1``, which runs kernels on CPU tensors). Evaluated on each call, not cached.
    """
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    if os.environ.get("TRITON_INTERPRET", "") == "1":
        return True
    return _cuda_available()


def _triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def pick_backend(backend: str, t) -> str:
    """A dispatcher's `backend` argument resolved for tensor `t`: "auto" takes the Triton kernel for CUDA
    tensors when triton imports, else the torch path; "triton" and "torch" force one (the kernel runs on
    CPU tensors only under TRITON_INTERPRET=1)."""
    if backend == "auto":
        return "triton" if t.is_cuda and _triton_importable() else "torch"
    if backend not in ("triton", "torch"):
        raise ValueError(f"unknown backend {backend!r}; use auto, triton or torch")
    return backend
