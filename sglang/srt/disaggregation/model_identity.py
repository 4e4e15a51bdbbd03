"""What an encoder and a language server compare before they work together (encoder disaggregation):
the architecture, the vision config, the image processor config and a fingerprint of the vision tower's
weights. Both sides compute it from their own checkpoint directory on disk, so the language server (which
never loads the vision weights) fingerprints exactly the bytes the encoder loaded.

A mismatch is refused by name: another architecture would answer with embeddings of another width, and
other weights with embeddings the language model was not trained on (silently wrong answers).
"""

from __future__ import annotations

import json
import mmap
import struct
from functools import lru_cache
from pathlib import Path

from sglang.srt.model_loader.weight_utils import safetensors_files

VISION_PREFIXES = ("visual.", "model.visual.")


def _vision_weights_digest(model_dir: Path) -> str:
    """xxh3-128 over the vision tensors (name, dtype, shape and bytes), in name order, read from the
    safetensors files as stored (mmap: nothing is converted)."""
    import xxhash

    entries = []
    for path in safetensors_files(model_dir):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, meta in header.items():
            if name != "__metadata__" and name.startswith(VISION_PREFIXES):
                entries.append((name.removeprefix("model."), meta, path, 8 + n))
    h = xxhash.xxh3_128()
    maps: dict[Path, mmap.mmap] = {}
    try:
        for name, meta, path, base in sorted(entries, key=lambda e: e[0]):
            if path not in maps:
                with open(path, "rb") as f:
                    maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            start, end = meta["data_offsets"]
            h.update(f"{name}|{meta['dtype']}|{meta['shape']}|".encode())
            h.update(memoryview(maps[path])[base + start : base + end])
    finally:
        for m in maps.values():
            try:
                m.close()
            except BufferError:  # a view still alive: closed when collected
                pass
    return h.hexdigest()


def _json_digest(obj) -> str:
    import xxhash

    return xxhash.xxh3_64(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@lru_cache(maxsize=8)
def model_identity(model_dir: str) -> dict:
    """{architecture, vision_config, image_processor, vision_weights}: digests except the architecture."""
    d = Path(model_dir)
    cfg = json.loads((d / "config.json").read_text())
    pre = d / "preprocessor_config.json"
    return {
        "architecture": (cfg.get("architectures") or ["?"])[0],
        "vision_config": _json_digest(cfg.get("vision_config") or {}),
        "image_processor": _json_digest(json.loads(pre.read_text())) if pre.exists() else "",
        "vision_weights": _vision_weights_digest(d),
    }


def identity_mismatch(mine: dict, theirs: dict) -> str | None:
    """None when both serve the same model, else a sentence naming what differs."""
    if not isinstance(theirs, dict):
        return "the encoder sent no model identity"
    diff = [k for k in mine if theirs.get(k) != mine[k]]
    if not diff:
        return None
    if "architecture" in diff:
        return f"it serves another architecture ({theirs.get('architecture')!r}, this server {mine['architecture']!r})"
    return f"it serves another checkpoint (differs in {', '.join(diff)})"
