"""transformers' video processor methods, reachable without torchvision (test support).

The classes cannot be touched where torchvision is missing (Qwen2-VL's module imports it at the top,
Qwen3-VL's class is a placeholder that raises), but their frame sampling and patch layout need only
math / numpy / torch: `hf_video_method` compiles one method from the installed source file, to be called
with a stand-in `self` holding the class attributes it reads (`hf_processor_self`).
"""

from __future__ import annotations

import ast
import inspect
import logging
import math
from types import SimpleNamespace

import numpy as np
import torch

QWEN2_VIDEO = ("qwen2_vl/video_processing_qwen2_vl", "Qwen2VLVideoProcessor")
QWEN3_VIDEO = ("qwen3_vl/video_processing_qwen3_vl", "Qwen3VLVideoProcessor")


def hf_video_method(module_and_class: tuple[str, str], name: str, extra: dict | None = None):
    """`extra`: more names the method's body reads (e.g. the module's `smart_resize`)."""
    import transformers.models as models
    from transformers.video_utils import VideoMetadata

    module, cls_name = module_and_class
    path = inspect.getfile(models).replace("__init__.py", f"{module}.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    ns = {"math": math, "np": np, "torch": torch, "VideoMetadata": VideoMetadata, "logger": logging.getLogger("hf"),
          **(extra or {})}
    exec(compile(ast.Module([fn], []), path, "exec"), ns)  # noqa: S102 - transformers' own installed source
    return ns[name]


def hf_processor_self(**over) -> SimpleNamespace:
    """The class attributes sample_frames reads: 2 fps, 4 to 768 frames, pairs (Qwen2-VL sampling at 2 fps,
    as this engine does)."""
    base = dict(fps=2.0, num_frames=None, min_frames=4, max_frames=768, temporal_patch_size=2)
    return SimpleNamespace(**{**base, **over})
