"""The manifest that lets ``make_model`` reuse an output folder instead of regenerating it.

``make_model`` deletes ``DIR/.make_model_manifest.json`` before it touches anything else in DIR and
writes it again last, after every shard and side file is complete, so a folder has a manifest only
when a run finished.  The manifest holds the identity of the run (everything that changes the
bytes: preset name and a digest of its definition, seed, dtype, shard limit, generator and
tokenizer versions), every file's size (plus the sha256 of the small side files; shards are only
sized, hashing gigabytes would cost as much as writing them) and ``manifest_hash``, a sha256 over
all of that.  :func:`check` says whether a folder still holds exactly that model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

MANIFEST_FILE = ".make_model_manifest.json"
HASHED_MAX_BYTES = 64 << 20  # files up to this size get a sha256 in the manifest (not the shards)
WEIGHT_GLOB = "model*.safetensors"


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def preset_digest(preset) -> str:
    """sha256 of the preset's full definition (shapes, init scheme, ...), not just its name."""
    d = dataclasses.asdict(preset)
    if d.get("text", {}).get("moe", 0) is None:
        del d["text"]["moe"]  # dense presets keep the digest they had before MoE presets existed
    return hashlib.sha256(_canonical(d)).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_entry(path: Path, name: str) -> dict:
    size = path.stat().st_size
    entry = {"size": size}
    if size <= HASHED_MAX_BYTES and not name.endswith(".safetensors"):
        entry["sha256"] = _sha256(path)
    return entry


def manifest_hash(content: dict) -> str:
    return hashlib.sha256(_canonical({k: v for k, v in content.items() if k != "manifest_hash"})).hexdigest()


def path(out_dir: str | os.PathLike) -> Path:
    return Path(out_dir) / MANIFEST_FILE


def remove(out_dir: str | os.PathLike) -> None:
    """Invalidate the folder: called before a run changes any file in it."""
    try:
        path(out_dir).unlink()
    except FileNotFoundError:
        pass


def write(out_dir: str | os.PathLike, identity: dict, files: list[str]) -> dict:
    """Write the manifest (atomically) for the finished ``files`` of ``out_dir``; returns it."""
    out = Path(out_dir)
    content = dict(identity)
    content["files"] = {name: _file_entry(out / name, name) for name in sorted(files)}
    content["manifest_hash"] = manifest_hash(content)
    tmp = out / (MANIFEST_FILE + ".partial")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        json.dump(content, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path(out))
    return content


def read(out_dir: str | os.PathLike) -> dict | None:
    try:
        with open(path(out_dir), encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) else None


def check(out_dir: str | os.PathLike, identity: dict) -> tuple[dict | None, str]:
    """``(manifest, "")`` when ``out_dir`` holds the complete model ``identity`` describes, else
    ``(None, why not)``."""
    out = Path(out_dir)
    content = read(out)
    if content is None:
        return None, f"no readable {MANIFEST_FILE} (new folder, or an earlier run did not finish)"
    if content.get("manifest_hash") != manifest_hash(content):
        return None, "the manifest does not match its manifest_hash (edited by hand?)"
    for key, want in identity.items():
        if content.get(key) != want:
            return None, f"made with {key}={content.get(key)!r}, asked for {want!r}"
    files = content.get("files")
    if not isinstance(files, dict) or not files:
        return None, "the manifest lists no files"
    for name, entry in files.items():
        f = out / name
        try:
            size = f.stat().st_size
        except OSError:
            return None, f"{name} is missing"
        if size != entry.get("size"):
            return None, f"{name} has {size} bytes, the manifest says {entry.get('size')}"
        if "sha256" in entry and _sha256(f) != entry["sha256"]:
            return None, f"{name} was changed after it was written"
    extra = sorted(p.name for p in out.glob(WEIGHT_GLOB) if p.name not in files)
    if extra:
        return None, f"weight files the manifest does not list: {', '.join(extra)}"
    return content, ""
