"""The model a server loads when no `--model-path` is given: the embedded tiny Qwen3-VL, generated
once with random weights by `sglang.testing.make_model` into the model cache (SGLANG_MODEL_CACHE or
~/.cache/sglang/models). Kept here so `server_args.py` depends on no test tooling."""

from __future__ import annotations

DEFAULT_MODEL_PRESET = "qwen3-vl-tiny"


def default_model_path() -> str:
    """Directory of the embedded default model, generated on first use (a few MB, no network)."""
    from sglang.testing.make_model import ensure_model

    return str(ensure_model(DEFAULT_MODEL_PRESET))


def resolve_model_path_or_default(model_path: str | None, revision: str | None = None) -> str:
    """`--model-path` as a directory or a locally cached hub id (`model_path.resolve_model_path`);
    none given: the embedded default model."""
    if model_path:
        from sglang.srt.model_loader.model_path import resolve_model_path

        return resolve_model_path(model_path, revision)
    return default_model_path()
