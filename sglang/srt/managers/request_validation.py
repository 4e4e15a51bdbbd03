"""Checks of one request's fields that need neither the tokenizer nor the processor: sampling parameters
(by name and type, refused fields named), token ids against the vocabulary, priority, and the media
sources of chat parts. Each problem is a `GenerateError` (400) naming the field."""

from __future__ import annotations

from typing import Any

from sglang.srt.errors import GenerateError
from sglang.srt.managers.field_policy import SAMPLING_REFUSED, refusal_message
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


def check_priority(priority: Any, server_args: ServerArgs) -> int:
    """A request's `priority`: honoured under priority scheduling, refused otherwise (never ignored)."""
    if priority is None:
        return 0
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise GenerateError(f"priority must be an integer, got {priority!r}")
    if not server_args.enable_priority_scheduling:
        raise GenerateError("priority is not honoured by this server: start it with --enable-priority-scheduling "
                            "(or --schedule-policy priority)")
    return priority


def merge_media_sources(sources: list[Any], media_data: list[Any], kind: str = "image") -> list[Any]:
    """Fills the message's `kind` parts (image or video) without a source (None) from `media_data`
    (the request's image_data or video_data), in order."""
    n_open = sum(s is None for s in sources)
    if n_open != len(media_data):
        raise GenerateError(
            f"the messages have {n_open} {kind} part(s) without a source but {len(media_data)} {kind}_data "
            "entries were given"
        )
    supplied = iter(media_data)
    return [next(supplied) if s is None else s for s in sources]


def make_sampling_params(raw: dict[str, Any] | None) -> tuple[SamplingParams, bool]:
    """The verified params, and whether max_new_tokens is "up to the context length" (given as None)."""
    if raw is not None and not isinstance(raw, dict):
        raise GenerateError(f"sampling_params must be an object, got {type(raw).__name__}")
    raw = raw or {}
    kw = {k: v for k, v in raw.items() if v is not None}
    if "sampling_seed" in kw:  # upstream's name
        if "seed" in kw and kw["seed"] != kw["sampling_seed"]:
            raise GenerateError("give either seed or sampling_seed, not both with different values")
        kw["seed"] = kw.pop("sampling_seed")
    if "min_tokens" in kw:  # vLLM's name
        kw["min_new_tokens"] = kw.pop("min_tokens")
    to_context = "max_new_tokens" in raw and raw["max_new_tokens"] is None
    known = SamplingParams.__dataclass_fields__
    for name, value in kw.items():
        refusal = SAMPLING_REFUSED.get(name)
        if refusal is not None and refusal.refuses(value):
            raise GenerateError(f"sampling_params.{refusal_message(name, refusal)}")
    kw = {k: v for k, v in kw.items() if k not in SAMPLING_REFUSED}  # their "off" values: nothing to do
    unknown = sorted(set(kw) - set(known))
    if unknown:
        raise GenerateError(f"unknown sampling parameter(s): {', '.join(unknown)}; known: {', '.join(known)}")
    if isinstance(kw.get("stop"), str):
        kw["stop"] = [kw["stop"]]
    for name, value in kw.items():
        _check_type(name, value, known[name].default)
    try:
        sp = SamplingParams(**kw)
        if to_context:
            sp.max_new_tokens = max(1, sp.min_new_tokens)  # placeholder until the prompt length is known
        sp.verify()
    except (ValueError, TypeError) as e:
        raise GenerateError(f"invalid sampling parameters: {e}") from None
    return sp, to_context


def _check_type(name: str, value: Any, default: Any) -> None:
    """Scalar parameters must have their default's type (ints count as floats), so errors name them."""
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    else:
        return
    if not ok:
        raise GenerateError(f"invalid sampling parameters: {name} must be {kind}, got {value!r}")


def check_input_ids(input_ids: Any, vocab_size: int) -> list[int]:
    if not isinstance(input_ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        raise GenerateError("input_ids must be a list of integers")
    bad = next((t for t in input_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise GenerateError(f"input_ids contains token id {bad} outside the vocabulary [0, {vocab_size})")
    return list(input_ids)
