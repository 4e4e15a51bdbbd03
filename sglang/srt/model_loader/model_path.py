"""`--model-path` as a directory or a hub id (`Qwen/Qwen3-VL-4B-Instruct`) already in the local
Hugging Face cache. Never downloads: a hub id that is not cached is an error naming the id and the
cache directory, so a server never reaches the network at start-up."""

from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelPathError(ValueError):
    pass


def resolve_model_path(path: str, revision: str | None = None) -> str:
    if os.path.isdir(path):
        return path
    if not _HUB_ID.match(path):
        raise ModelPathError(f"--model-path {path!r} is not a directory (and not a hub id like 'Org/Name')")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(path, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as e:
        raise ModelPathError(
            f"--model-path {path!r} is neither a directory nor in the local Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); this server never downloads: fetch it first "
            f"(e.g. `huggingface-cli download {path}`) or pass a directory ({type(e).__name__})"
        ) from None
