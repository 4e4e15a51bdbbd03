"""Deterministic random-weight Qwen-VL model generator.

Writes a Hugging Face format model directory that transformers 5.x loads as is::

    python -m sglang.testing.make_model --preset qwen3-vl-tiny --out /tmp/qwen3-vl-tiny [--seed 0] [--dtype float32]

Files: ``config.json``, ``generation_config.json``, ``preprocessor_config.json``,
``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``
when the weights exceed the shard size, ~2 GB), ``tokenizer.json``, ``tokenizer_config.json``,
``special_tokens_map.json``, ``chat_template.jinja``, ``sglang_make_model.json`` (what made it) and,
written last, ``.make_model_manifest.json`` (see :mod:`sglang.testing.model_manifest`).

Reuse: when the output folder already holds a complete model of the same preset, seed, dtype,
shard limit and generator version (its manifest matches and every listed file has its recorded
size), nothing is regenerated; anything missing, mismatched or left half-written by a killed run
regenerates the folder, and ``force=True`` (``--force``) always does.

Weights are enumerated from the preset (no transformers needed) with the tensor names of the
public Hub checkpoints, and every value is a pure function of ``(seed, tensor name, shape)``: each
tensor is cut into independently seeded blocks filled by a thread pool (see
:mod:`sglang.testing.weight_gen`), so the bytes do not depend on the thread count.  The
safetensors files are streamed block by block while the next blocks (and the next shard) are
being generated; memory stays at a few blocks per thread, whatever the model size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sglang.testing import model_manifest
from sglang.testing.model_files import (  # noqa: F401  (re-exported: the public names of this module)
    QUANTIZE_CHOICES,
    _write_json,
    build_config_dict,
    build_generation_config,
    build_preprocessor_config,
    count_parameters,
    tensor_specs,
    write_config_only,
)
from sglang.testing.presets import ModelPreset, get_preset, list_presets, resolve_dtype, with_text_layers
# the safetensors writer; `_write_weights` calls it through this module's name (tests swap it here)
from sglang.testing.safetensors_writer import _write_safetensors, plan_shards  # noqa: F401
from sglang.testing.weight_gen import (  # noqa: F401  (re-exported: the public names of this module)
    BIAS,
    EMBED,
    NORM,
    VOCAB,
    WEIGHT,
    TensorSpec,
    default_threads,
    float32_to_bf16_bits,
    iter_blocks,
    iter_tensor_chunks,
    tensor_seed,
)

_float32_to_bf16_bits = float32_to_bf16_bits


# Bump whenever the bytes of a generated model change (values, layout, file set): folders made by
# another version are regenerated instead of reused.  3: blocked, parallel SFC64 generation; 4: Qwen3.5
# dt_bias drawn around -4 (long-lived DeltaNet states).
GENERATOR_VERSION = 4
DEFAULT_MAX_SHARD_BYTES = 2_000_000_000  # ~2 GB per shard
STAMP_FILE = "sglang_make_model.json"
SAFE_INDEX = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MANIFEST_FILE = model_manifest.MANIFEST_FILE

# ----------------------------------------------------------------------------- values


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


# ----------------------------------------------------------------------------- weight files


def _write_weights(
    out: Path, p: ModelPreset, seed: int, dtype: str, max_shard_bytes: int, threads: int, progress: bool
) -> list[str]:
    """Write the weight files (and the index when sharded); returns their names."""
    specs = tensor_specs(p)
    shards = plan_shards(specs, dtype, max_shard_bytes)
    total_bytes = sum(s.nbytes(dtype) for s in specs)
    bar = _progress_bar(total_bytes, f"{p.name} weights", progress and not p.tiny)
    on_bytes = bar.update if bar is not None else None
    blocks = iter_blocks(specs, p, seed, dtype, threads)
    try:
        if len(shards) == 1:
            _write_safetensors(out / SINGLE_FILE, shards[0], dtype, blocks, on_bytes)
            return [SINGLE_FILE]
        n = len(shards)
        weight_map: dict[str, str] = {}
        for i, shard in enumerate(shards, start=1):
            fname = f"model-{i:05d}-of-{n:05d}.safetensors"
            if bar is not None:
                bar.set_description(f"{p.name} shard {i}/{n}")
            _write_safetensors(out / fname, shard, dtype, blocks, on_bytes)
            weight_map.update({s.name: fname for s in shard})
    finally:
        blocks.close()
        if bar is not None:
            bar.close()
    index = {
        "metadata": {"total_size": total_bytes, "total_parameters": sum(s.numel for s in specs)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    _write_json(out / SAFE_INDEX, index)
    return sorted(set(weight_map.values())) + [SAFE_INDEX]


# ----------------------------------------------------------------------------- model dir


def _identity(p: ModelPreset, seed: int, dtype: str, max_shard_bytes: int, quantize: str | None = None) -> dict:
    """Everything that changes the bytes of the output folder (and nothing else: not the threads)."""
    from sglang.testing.tokenizer_builder import TOKENIZER_VERSION

    extra = {"quantize": quantize} if quantize else {}
    if quantize == "fp8":  # the scale block changes the bytes (tiny presets: smaller blocks)
        from sglang.testing.fp8_checkpoint import BLOCK, TINY_BLOCK

        extra["fp8_block"] = list(TINY_BLOCK if p.tiny else BLOCK)
    return {**extra,
        "generator": "sglang.testing.make_model",
        "generator_version": GENERATOR_VERSION,
        "tokenizer_version": TOKENIZER_VERSION,
        "preset": p.name,
        "preset_digest": model_manifest.preset_digest(p),
        "seed": int(seed),
        "dtype": dtype,
        "max_shard_bytes": int(max_shard_bytes),
    }


def _progress_bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


@dataclass(frozen=True)
class MakeResult:
    path: Path
    reused: bool  # the folder already held this model: nothing was written
    reason: str  # why it was (re)generated; "" when reused
    manifest: dict
    seconds: float
    threads: int


def build_model(
    preset: str | ModelPreset,
    out_dir: str | os.PathLike,
    seed: int = 0,
    dtype: str | None = None,
    progress: bool = True,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    threads: int | None = None,
    force: bool = False,
    quantize: str | None = None,
) -> MakeResult:
    """:func:`make_model`, returning whether the folder was reused and why not. ``quantize="fp8"``
    rewrites the text decoder's linears in the layout of Qwen's -FP8 releases (sglang.testing.fp8_checkpoint)."""
    from sglang.testing.tokenizer_builder import write_tokenizer_files

    t0 = time.perf_counter()
    p = get_preset(preset)
    d = resolve_dtype(p, dtype)
    seed = int(seed)
    threads = default_threads() if threads is None else int(threads)
    if max_shard_bytes <= 0:
        raise ValueError("max_shard_bytes must be positive")
    if threads < 1:
        raise ValueError("threads must be >= 1")
    out = Path(out_dir)
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {QUANTIZE_CHOICES}, got {quantize!r}")
    identity = _identity(p, seed, d, max_shard_bytes, quantize)
    if force:
        reason = "forced"
    else:
        found, reason = model_manifest.check(out, identity)
        if found is not None:
            return MakeResult(out, True, "", found, time.perf_counter() - t0, threads)
    out.mkdir(parents=True, exist_ok=True)

    # The manifest goes first, so a run killed from here on leaves a folder that is never reused;
    # then the weights of an earlier run, so a stale shard set can never be picked up.
    model_manifest.remove(out)
    stale = list(out.glob("model*.safetensors")) + list(out.glob("*.partial"))
    for old in stale + [out / SAFE_INDEX, out / STAMP_FILE]:
        if old.exists():
            old.unlink()

    files = _write_weights(out, p, seed, d, max_shard_bytes, threads, progress)
    config = build_config_dict(p, d)
    for name, obj in [
        ("config.json", config),
        ("generation_config.json", build_generation_config(p)),
        ("preprocessor_config.json", build_preprocessor_config(p)),
    ]:
        _write_json(out / name, obj)
        files.append(name)
    if quantize == "fp8":
        from sglang.testing.fp8_checkpoint import BLOCK, TINY_BLOCK, quantize_folder

        quantize_folder(out, TINY_BLOCK if p.tiny else BLOCK)
    tok = write_tokenizer_files(out, p.family, model_max_length=p.text.max_position_embeddings)
    files += [Path(f).name for f in tok]
    _write_json(out / STAMP_FILE, identity)
    files.append(STAMP_FILE)
    manifest = model_manifest.write(out, identity, files)  # last: the folder is complete
    return MakeResult(out, False, reason, manifest, time.perf_counter() - t0, threads)


def make_model(
    preset: str | ModelPreset,
    out_dir: str | os.PathLike,
    seed: int = 0,
    dtype: str | None = None,
    progress: bool = True,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    threads: int | None = None,
    force: bool = False,
    quantize: str | None = None,
) -> Path:
    """Write the model directory for ``preset`` into ``out_dir`` and return its path.

    When ``out_dir`` already holds the complete model of this preset, seed, dtype, shard limit and
    generator version (see :mod:`sglang.testing.model_manifest`), it is returned untouched, unless
    ``force``.  ``progress``: show a tqdm bar (only for presets that take a while, i.e. non-tiny
    ones).  ``max_shard_bytes``: shard limit; weights above it are split into
    ``model-0000i-of-0000n``.  ``threads``: generator threads (default: the CPUs this process may
    use); the bytes do not depend on it.
    """
    return build_model(preset, out_dir, seed, dtype, progress, max_shard_bytes, threads, force, quantize).path


def default_cache_dir() -> Path:
    from sglang.srt.environ import envs

    env = envs.SGLANG_MODEL_CACHE.get()
    return Path(env).expanduser() if env else Path("~/.cache/sglang/models").expanduser()


def ensure_model(
    preset: str | ModelPreset,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    dtype: str | None = None,
    progress: bool = True,
    threads: int | None = None,
) -> Path:
    """Return ``<cache_dir>/<preset>-seed<seed>`` (with a ``-<dtype>`` suffix for a non-default
    dtype), generating it on first use (and again when its manifest no longer matches).

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
    identity = _identity(p, seed, d, DEFAULT_MAX_SHARD_BYTES)

    def complete() -> bool:
        return model_manifest.check(final, identity)[0] is not None

    if complete():
        return final

    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache))
    try:
        make_model(p, tmp, seed=seed, dtype=d, progress=progress, threads=threads)
        os.chmod(tmp, 0o755)
        if final.exists() and not complete():
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
            if complete():  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
                return final
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# ----------------------------------------------------------------------------- CLI

_EPILOG = f"""\
reuse: when --out already holds a complete model made by this generator version from the
same preset, seed, dtype and shard limit (its {MANIFEST_FILE}, written last,
matches, and every file it lists is there with its recorded size), nothing is rewritten and
one line 'reused DIR ...' is printed; anything missing, changed or half-written (a killed run
leaves no manifest) regenerates the model files of DIR.  --force always regenerates.
--threads changes the speed, never the bytes.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m sglang.testing.make_model",
        description="Write a deterministic random-weight Qwen-VL model in Hugging Face format.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--preset", choices=sorted(list_presets()), help="model preset")
    ap.add_argument("--out", help="output directory (reused as is when it already holds this model)")
    ap.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the preset's)")
    ap.add_argument("--threads", type=int, default=None, metavar="N",
                    help=f"generator threads (default: the CPUs this process may use, here {default_threads()})")
    ap.add_argument("--num-layers", type=int, default=None, metavar="N",
                    help="only N text decoder layers (widths and vision tower as the preset): a short replica")
    ap.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                    help="fp8: text linears and MoE experts as Qwen's -FP8 releases store them (e4m3, 128x128 scales)")
    ap.add_argument("--force", action="store_true", help="regenerate even when --out already holds this model")
    ap.add_argument("--config-only", action="store_true",
                    help="only config.json, the tokenizer and processor files, no weights: for --load-format dummy")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--list", action="store_true", help="list presets with parameter counts and exit")
    ap.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.list:
        for name in list_presets():
            p = get_preset(name)
            print(f"{name:16s} {p.family:11s} {count_parameters(p):>15,d} params  default dtype {p.default_dtype}")
        return 0
    if not args.preset or not args.out:
        ap.error("--preset and --out are required")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be >= 1")
    preset = args.preset
    if args.num_layers is not None:
        try:
            preset = with_text_layers(preset, args.num_layers)
        except ValueError as e:
            ap.error(str(e))
    if args.config_only:
        out = write_config_only(preset, args.out, args.dtype, args.quantize)
        print(f"wrote {out} (preset {get_preset(preset).name}: config, tokenizer and processor files only; serve it "
              "with --load-format dummy)")
        return 0
    r = build_model(
        preset,
        args.out,
        seed=args.seed,
        dtype=args.dtype,
        progress=not args.no_progress,
        max_shard_bytes=args.max_shard_bytes,
        threads=args.threads,
        force=args.force,
        quantize=args.quantize,
    )
    m = r.manifest
    what = f"preset {m['preset']}, seed {m['seed']}, {m['dtype']}{', ' + args.quantize if args.quantize else ''}, generator v{m['generator_version']}"
    if r.reused:
        print(f"reused {r.path} ({what}, manifest {m['manifest_hash'][:12]}; --force regenerates)")
    else:
        gb = sum(e["size"] for n, e in m["files"].items() if n.endswith(".safetensors")) / 1e9
        print(f"wrote {r.path} ({what}, {gb:.2f} GB of weights in {r.seconds:.1f} s on {r.threads} thread(s); "
              f"regenerated because: {r.reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
