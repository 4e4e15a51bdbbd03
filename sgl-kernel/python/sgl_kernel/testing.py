"""Helpers for testing kernels on CPU under the Triton interpreter."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from types import ModuleType
from typing import Iterator


@contextlib.contextmanager
def interpreted(module_name: str) -> Iterator[ModuleType]:
    """Imports the kernel module `module_name` afresh with TRITON_INTERPRET=1 and yields it.

    `triton.jit` picks compiled or interpreted at decoration (import) time, so the module is dropped
    from `sys.modules` before and after: the interpreted kernels serve only callers inside the block,
    and the process environment is restored, so nothing else in the process runs interpreted.

    triton itself may already be imported in compiled mode, and so are the @jit helpers of
    `triton.language.standard` (tl.zeros, tl.sum, tl.max, ...): kernels tested this way use only core
    builtins (tl.full, tl.load, tl.store, ...), or the test process sets TRITON_INTERPRET=1 up front."""
    old = os.environ.get("TRITON_INTERPRET")
    sys.modules.pop(module_name, None)
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield importlib.import_module(module_name)
    finally:
        sys.modules.pop(module_name, None)
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
