"""SGLang-style serving engine for vision-language models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang.version import __version__

if TYPE_CHECKING:
    from sglang.srt.entrypoints.engine import Engine


def __getattr__(name: str) -> Any:
    # Lazy, so `import sglang` (and every spawned child) stays cheap.
    if name == "Engine":
        from sglang.srt.entrypoints.engine import Engine

        return Engine
    raise AttributeError(f"module 'sglang' has no attribute {name!r}")


__all__ = ["Engine", "__version__"]
