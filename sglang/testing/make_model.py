"""Deterministic random-weight Qwen-VL model generator.

Writes a Hugging Face format model directory that transformers 5.x loads as is::

    python -m sglang.testing.make_model --preset qwen3-vl-tiny --out /tmp/qwen3-vl-tiny [--seed 0] [--dtype float32]

Files: ``config.json``, ``generation_config.json``, ``preprocessor_config.json``,
``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``
when the weights exceed the shard size, ~2 GB), ``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, ``chat_template.jinja``.

Weights are enumerated from the preset (no transformers needed) with the tensor names of the
public Hub checkpoints, and every value is a pure function of ``(seed, tensor name, shape)``:
a numpy PCG64 stream seeded from ``sha256(f"{seed}:{name}")`` (see :func:`tensor_seed`), drawn in
fixed-size row chunks, scaled per tensor kind, then rounded to the target dtype.  The safetensors
files are streamed chunk by chunk, so peak memory stays at one chunk (~64 MB), whatever the model
size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from sglang.testing.presets import (
    PRESETS,
    ModelPreset,
    build_config_dict,
    build_generation_config,
    build_preprocessor_config,
    get_preset,
    resolve_dtype,
)

GENERATOR_VERSION = 2
DEFAULT_MAX_SHARD_BYTES = 2_000_000_000  # ~2 GB per shard
CHUNK_ELEMS = 1 << 24  # values drawn per chunk (64 MB of float32)
STAMP_FILE = "sglang_make_model.json"
SAFE_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}

# Tensor kinds (select the init distribution).
WEIGHT, EMBED, BIAS, NORM = "weight", "embed", "bias", "norm"
VOCAB = "vocab"  # token embedding / lm_head: rows indexed by token id


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    kind: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# ----------------------------------------------------------------------------- enumeration


def _linear(prefix: str, out_f: int, in_f: int, bias: bool) -> list[TensorSpec]:
    specs = [TensorSpec(f"{prefix}.weight", (out_f, in_f), WEIGHT)]
    if bias:
        specs.append(TensorSpec(f"{prefix}.bias", (out_f,), BIAS))
    return specs


def _norm(prefix: str, dim: int, bias: bool) -> list[TensorSpec]:
    specs = [TensorSpec(f"{prefix}.weight", (dim,), NORM)]
    if bias:
        specs.append(TensorSpec(f"{prefix}.bias", (dim,), BIAS))
    return specs


def _qwen3_vision_specs(p: ModelPreset) -> list[TensorSpec]:
    v = p.vision
    h, m = v.hidden_size, v.spatial_merge_size
    merged = h * m * m
    pre = "model.visual"
    specs = [
        TensorSpec(
            f"{pre}.patch_embed.proj.weight",
            (h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size),
            WEIGHT,
        ),
        TensorSpec(f"{pre}.patch_embed.proj.bias", (h,), BIAS),
        TensorSpec(f"{pre}.pos_embed.weight", (v.num_position_embeddings, h), EMBED),
    ]
    for i in range(v.depth):
        b = f"{pre}.blocks.{i}"
        specs += _norm(f"{b}.norm1", h, True)
        specs += _norm(f"{b}.norm2", h, True)
        specs += _linear(f"{b}.attn.qkv", 3 * h, h, True)
        specs += _linear(f"{b}.attn.proj", h, h, True)
        specs += _linear(f"{b}.mlp.linear_fc1", v.intermediate_size, h, True)
        specs += _linear(f"{b}.mlp.linear_fc2", h, v.intermediate_size, True)
    specs += _norm(f"{pre}.merger.norm", h, True)  # pre-shuffle norm over the vision hidden size
    specs += _linear(f"{pre}.merger.linear_fc1", merged, merged, True)
    specs += _linear(f"{pre}.merger.linear_fc2", v.out_hidden_size, merged, True)
    for k in range(len(v.deepstack_visual_indexes)):
        d = f"{pre}.deepstack_merger_list.{k}"
        specs += _norm(f"{d}.norm", merged, True)  # post-shuffle norm over hidden * merge^2
        specs += _linear(f"{d}.linear_fc1", merged, merged, True)
        specs += _linear(f"{d}.linear_fc2", v.out_hidden_size, merged, True)
    return specs


def _qwen25_vision_specs(p: ModelPreset) -> list[TensorSpec]:
    v = p.vision
    h, m = v.hidden_size, v.spatial_merge_size
    merged = h * m * m
    pre = "visual"
    specs = [
        TensorSpec(
            f"{pre}.patch_embed.proj.weight",
            (h, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size),
            WEIGHT,
        )
    ]
    for i in range(v.depth):
        b = f"{pre}.blocks.{i}"
        specs += _norm(f"{b}.norm1", h, False)  # RMSNorm
        specs += _norm(f"{b}.norm2", h, False)
        specs += _linear(f"{b}.attn.qkv", 3 * h, h, True)
        specs += _linear(f"{b}.attn.proj", h, h, True)
        specs += _linear(f"{b}.mlp.gate_proj", v.intermediate_size, h, True)
        specs += _linear(f"{b}.mlp.up_proj", v.intermediate_size, h, True)
        specs += _linear(f"{b}.mlp.down_proj", h, v.intermediate_size, True)
    specs += _norm(f"{pre}.merger.ln_q", h, False)
    specs += _linear(f"{pre}.merger.mlp.0", merged, merged, True)
    specs += _linear(f"{pre}.merger.mlp.2", v.out_hidden_size, merged, True)
    return specs


def _text_specs(p: ModelPreset) -> list[TensorSpec]:
    t = p.text
    qwen3 = p.is_qwen3
    pre = "model.language_model" if qwen3 else "model"
    h, hd = t.hidden_size, t.head_dim
    q_out, kv_out = t.num_attention_heads * hd, t.num_key_value_heads * hd
    qkv_bias = not qwen3
    specs = [TensorSpec(f"{pre}.embed_tokens.weight", (t.vocab_size, h), VOCAB)]
    for i in range(t.num_hidden_layers):
        b = f"{pre}.layers.{i}"
        specs += _linear(f"{b}.self_attn.q_proj", q_out, h, qkv_bias)
        specs += _linear(f"{b}.self_attn.k_proj", kv_out, h, qkv_bias)
        specs += _linear(f"{b}.self_attn.v_proj", kv_out, h, qkv_bias)
        specs += _linear(f"{b}.self_attn.o_proj", h, q_out, False)
        if qwen3:
            specs += _norm(f"{b}.self_attn.q_norm", hd, False)
            specs += _norm(f"{b}.self_attn.k_norm", hd, False)
        specs += _linear(f"{b}.mlp.gate_proj", t.intermediate_size, h, False)
        specs += _linear(f"{b}.mlp.up_proj", t.intermediate_size, h, False)
        specs += _linear(f"{b}.mlp.down_proj", h, t.intermediate_size, False)
        specs += _norm(f"{b}.input_layernorm", h, False)
        specs += _norm(f"{b}.post_attention_layernorm", h, False)
    specs += _norm(f"{pre}.norm", h, False)
    if not p.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", (t.vocab_size, h), VOCAB))
    return specs


def tensor_specs(preset: str | ModelPreset) -> list[TensorSpec]:
    """All checkpoint tensors (Hub names, shapes, init kinds), in file order."""
    p = get_preset(preset)
    vision = _qwen3_vision_specs(p) if p.is_qwen3 else _qwen25_vision_specs(p)
    return vision + _text_specs(p)


def count_parameters(preset: str | ModelPreset, part: str = "all") -> int:
    """Parameter count (tied lm_head counted once). ``part``: "all", "vision" or "text"."""
    specs = tensor_specs(preset)
    if part == "vision":
        specs = [s for s in specs if "visual." in s.name]
    elif part == "text":
        specs = [s for s in specs if "visual." not in s.name]
    elif part != "all":
        raise ValueError(part)
    return sum(s.numel for s in specs)


# ----------------------------------------------------------------------------- values


def tensor_seed(seed: int, name: str) -> int:
    """Stable 128-bit seed for one tensor (independent of Python's hash randomization)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:16], "little")


def _float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bfloat16, returned as uint16 bit patterns (finite input)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return values.astype(np.float32, copy=False)
    if dtype == "float16":
        return values.astype(np.float16)
    if dtype == "bfloat16":
        return _float32_to_bf16_bits(values)
    raise ValueError(dtype)


def _scale(spec: TensorSpec, preset: ModelPreset) -> tuple[float, float]:
    """(mean, std) for the tensor's kind."""
    init = preset.init
    if spec.kind == WEIGHT:
        return 0.0, init.weight_std
    if spec.kind in (EMBED, VOCAB):
        return 0.0, init.embed_std
    if spec.kind == BIAS:
        return 0.0, init.bias_std
    if spec.kind == NORM:
        return 1.0, init.norm_noise_std
    raise ValueError(spec.kind)


def _vocab_row_std(p: ModelPreset, vocab: int, std: float) -> np.ndarray:
    """Per-row std of a vocabulary matrix: ids the tokenizer never produces (reserved fillers and the
    padding past the added tokens) get `unused_vocab_scale` of it, so a random model's greedy output
    is mostly real tokens rather than `<|reserved_N|>` fillers."""
    from sglang.testing.tokenizer_builder import added_tokens, trained_vocab_size

    out = np.full(vocab, std * p.init.unused_vocab_scale, dtype=np.float32)
    out[: trained_vocab_size()] = std
    for tid, _, _ in added_tokens(p.family):
        if tid < vocab:
            out[tid] = std
    return out


def iter_tensor_chunks(spec: TensorSpec, preset: str | ModelPreset, seed: int, dtype: str) -> Iterator[np.ndarray]:
    """Yield the tensor's encoded values (flat, C order) in deterministic chunks.

    float32/float16 chunks have that numpy dtype; bfloat16 chunks are uint16 bit patterns.
    """
    p = get_preset(preset)
    mean, std = _scale(spec, p)
    rng = np.random.Generator(np.random.PCG64(tensor_seed(seed, spec.name)))
    total = spec.numel
    row = math.prod(spec.shape[1:]) if len(spec.shape) > 1 else 1
    per_chunk = max(1, CHUNK_ELEMS // row) * row  # whole rows per chunk
    row_std = _vocab_row_std(p, spec.shape[0], std) if spec.kind == VOCAB else None
    done = 0
    while done < total:
        n = min(per_chunk, total - done)
        vals = rng.standard_normal(n, dtype=np.float32)
        if row_std is None:
            vals *= np.float32(std)
        else:
            r0 = done // row
            vals = (vals.reshape(-1, row) * row_std[r0 : r0 + n // row, None]).reshape(-1)
        if mean:
            vals += np.float32(mean)
        yield _encode(vals, dtype)
        done += n


def generate_tensor(preset: str | ModelPreset, name: str, seed: int = 0, dtype: str | None = None):
    """One tensor as a ``torch.Tensor`` (exactly the values written to disk)."""
    import torch

    p = get_preset(preset)
    d = resolve_dtype(p, dtype)
    spec = next((s for s in tensor_specs(p) if s.name == name), None)
    if spec is None:
        raise KeyError(f"{name!r} is not a tensor of {p.name}")
    flat = np.concatenate(list(iter_tensor_chunks(spec, p, seed, d)))
    if d == "bfloat16":
        t = torch.from_numpy(flat.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(flat)
    return t.reshape(spec.shape)


# ----------------------------------------------------------------------------- safetensors


def _nbytes(spec: TensorSpec, dtype: str) -> int:
    return spec.numel * _ITEMSIZE[dtype]


def _write_safetensors(
    path: Path,
    specs: list[TensorSpec],
    dtype: str,
    chunks: Callable[[TensorSpec], Iterable[np.ndarray]],
    on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Stream tensors into a safetensors file without materializing them."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        n = _nbytes(s, dtype)
        header[s.name] = {"dtype": _ST_DTYPE[dtype], "shape": list(s.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for s in specs:
            written = 0
            for chunk in chunks(s):
                b = chunk.tobytes() if sys.byteorder == "little" else chunk.byteswap().tobytes()
                f.write(b)
                written += len(b)
                if on_bytes is not None:
                    on_bytes(len(b))
            if written != _nbytes(s, dtype):
                raise RuntimeError(f"{s.name}: wrote {written} bytes, expected {_nbytes(s, dtype)}")
    os.replace(tmp, path)


def plan_shards(specs: list[TensorSpec], dtype: str, max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Greedy packing in file order; a tensor larger than the limit gets a shard of its own."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        n = _nbytes(s, dtype)
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += n
    return shards


# ----------------------------------------------------------------------------- model dir


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def _stamp(p: ModelPreset, seed: int, dtype: str) -> dict:
    from sglang.testing.tokenizer_builder import TOKENIZER_VERSION

    return {
        "generator": "sglang.testing.make_model",
        "generator_version": GENERATOR_VERSION,
        "tokenizer_version": TOKENIZER_VERSION,
        "preset": p.name,
        "seed": int(seed),
        "dtype": dtype,
    }


def _progress_bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def make_model(
    preset: str | ModelPreset,
    out_dir: str | os.PathLike,
    seed: int = 0,
    dtype: str | None = None,
    progress: bool = True,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> Path:
    """Write the model directory for ``preset`` into ``out_dir`` and return its path.

    ``progress``: show a tqdm bar (only for presets that take a while, i.e. non-tiny ones).
    ``max_shard_bytes``: shard limit; weights above it are split into ``model-0000i-of-0000n``.
    """
    from sglang.testing.tokenizer_builder import write_tokenizer_files

    p = get_preset(preset)
    d = resolve_dtype(p, dtype)
    seed = int(seed)
    if max_shard_bytes <= 0:
        raise ValueError("max_shard_bytes must be positive")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    # Remove weights of an earlier run so a stale shard set can never be picked up.
    for old in list(out.glob("model*.safetensors")) + [out / SAFE_INDEX, out / STAMP_FILE]:
        if old.exists():
            old.unlink()

    specs = tensor_specs(p)
    shards = plan_shards(specs, d, max_shard_bytes)
    total_bytes = sum(_nbytes(s, d) for s in specs)
    bar = _progress_bar(total_bytes, f"{p.name} weights", progress and not p.tiny)
    on_bytes = bar.update if bar is not None else None

    def chunks(s: TensorSpec):
        return iter_tensor_chunks(s, p, seed, d)

    try:
        if len(shards) == 1:
            _write_safetensors(out / SINGLE_FILE, shards[0], d, chunks, on_bytes)
        else:
            n = len(shards)
            weight_map: dict[str, str] = {}
            for i, shard in enumerate(shards, start=1):
                fname = f"model-{i:05d}-of-{n:05d}.safetensors"
                if bar is not None:
                    bar.set_description(f"{p.name} shard {i}/{n}")
                _write_safetensors(out / fname, shard, d, chunks, on_bytes)
                weight_map.update({s.name: fname for s in shard})
            index = {
                "metadata": {"total_size": total_bytes, "total_parameters": sum(s.numel for s in specs)},
                "weight_map": dict(sorted(weight_map.items())),
            }
            _write_json(out / SAFE_INDEX, index)
    finally:
        if bar is not None:
            bar.close()

    _write_json(out / "config.json", build_config_dict(p, d))
    _write_json(out / "generation_config.json", build_generation_config(p))
    _write_json(out / "preprocessor_config.json", build_preprocessor_config(p))
    write_tokenizer_files(out, p.family, model_max_length=p.text.max_position_embeddings)
    _write_json(out / STAMP_FILE, _stamp(p, seed, d))
    return out


def default_cache_dir() -> Path:
    from sglang.srt.environ import envs

    env = envs.SGLANG_MODEL_CACHE.get()
    return Path(env).expanduser() if env else Path("~/.cache/sglang/models").expanduser()


def _stamp_ok(path: Path, expected: dict) -> bool:
    try:
        with open(path / STAMP_FILE, encoding="utf-8") as f:
            return json.load(f) == expected
    except (OSError, ValueError):
        return False


def ensure_model(
    preset: str | ModelPreset,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    dtype: str | None = None,
    progress: bool = True,
) -> Path:
    """Return ``<cache_dir>/<preset>-seed<seed>`` (with a ``-<dtype>`` suffix for a non-default
    dtype), generating it on first use.

    The model is written into a temporary sibling directory and renamed into place, so a
    half-written model is never visible; concurrent callers race benignly (one rename wins).
    ``cache_dir`` defaults to ``$SGLANG_MODEL_CACHE`` or ``~/.cache/sglang/models``.
    """
    p = get_preset(preset)
    d = resolve_dtype(p, dtype)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    name = f"{p.name}-seed{int(seed)}" + ("" if d == p.default_dtype else f"-{d}")
    final = cache / name
    expected = _stamp(p, seed, d)
    if _stamp_ok(final, expected):
        return final

    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
    try:
        make_model(p, tmp, seed=seed, dtype=d, progress=progress)
        os.chmod(tmp, 0o755)
        if final.exists() and not _stamp_ok(final, expected):
            # Stale (older generator version) or half-baked by hand: move it out of the way.
            trash = cache / f".{name}.stale-{uuid.uuid4().hex}"
            try:
                os.rename(final, trash)
            except OSError:
                pass
            else:
                shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if _stamp_ok(final, expected):  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
                return final
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sglang.testing.make_model",
        description="Write a deterministic random-weight Qwen-VL model in Hugging Face format.",
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), help="model preset")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the preset's)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--list", action="store_true", help="list presets with parameter counts and exit")
    ap.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.list:
        for name, p in PRESETS.items():
            print(f"{name:16s} {p.family:11s} {count_parameters(p):>15,d} params  default dtype {p.default_dtype}")
        return 0
    if not args.preset or not args.out:
        ap.error("--preset and --out are required")
    out = make_model(
        args.preset,
        args.out,
        seed=args.seed,
        dtype=args.dtype,
        progress=not args.no_progress,
        max_shard_bytes=args.max_shard_bytes,
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
