"""Our own Triton kernels for the sglang serving engine, grouped by domain in submodules.

The package imports without triton. Callers ask :func:`triton_available` before taking a Triton path
and fall back to the pure-torch implementation otherwise. Kernels are tested on CPU by running them
under the Triton interpreter (``TRITON_INTERPRET=1``) on float32 tensors, and on CUDA by the tests
marked ``gpu``.
"""

from __future__ import annotations

import importlib
import os

__all__ = ["triton_available"]

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
