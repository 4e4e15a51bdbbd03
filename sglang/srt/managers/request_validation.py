"""Checks of one request's fields that need neither the tokenizer nor the processor: sampling parameters
(by name and type, refused fields named), token ids against the vocabulary, priority, the media
sources of chat parts, what --skip-tokenizer-init and local-file rules refuse, the DP rank asked for,
and (once tokenized) the prompt's and the output's room in the context and the KV cache. Each problem
is a `GenerateError` (400) naming the field or the limit. `RequestBuilder` calls them: on the event loop
all but `check_in_worker` and the length checks, which run in its worker thread."""

from __future__ import annotations

from typing import Any

from sglang.srt.errors import GenerateError
from sglang.srt.managers.field_policy import SAMPLING_REFUSED, refusal_message
from sglang.srt.multimodal.image_io import is_local_path_source
from sglang.srt.sampling.client_threads import ClientThreadsBusy
from sglang.srt.sampling.custom_logit_processor import (
    CustomLogitProcessorError,
    check_processor_format,
    checked_processor,
)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_regex import StopRegexError, checked_patterns
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


def check_custom_logit_processor(processor: Any, server_args: ServerArgs) -> str | None:
    """A request's custom_logit_processor, on the event loop: a 400 with upstream's message when the server
    does not run client processors, or naming what is wrong with the string's form. Runs none of the
    client's code: `check_in_worker` unpickles and instantiates it."""
    if processor is None:
        return None
    if not server_args.enable_custom_logit_processor:
        raise GenerateError("The server is not configured to enable custom logit processor. "
                            "Please set `--enable-custom-logit-processor` to enable this feature.")
    try:
        check_processor_format(processor)
    except CustomLogitProcessorError as e:
        raise GenerateError(f"invalid custom_logit_processor: {e}") from None
    return processor


def check_in_worker(sampling: SamplingParams, processor: str | None) -> None:
    """The checks that run work a client controls, for a request whose cheap checks passed on the event
    loop (`make_sampling_params(..., compile_patterns=False)`, `check_custom_logit_processor`): its
    stop_regex patterns are parsed, size-checked, compiled and probed, and its custom_logit_processor is
    unpickled and instantiated in a thread of its own, at most LOAD_TIMEOUT_S (400 past it; 503 when every
    such thread is held by earlier processors that never returned). Run in the request's worker thread."""
    if sampling.stop_regex:
        try:
            sampling.stop_regex = checked_patterns(sampling.stop_regex)
        except StopRegexError as e:
            raise GenerateError(f"invalid sampling parameters: {e}") from None
    if processor is None:
        return
    try:
        checked_processor(processor)
    except CustomLogitProcessorError as e:
        raise GenerateError(f"invalid custom_logit_processor: {e}") from None
    except ClientThreadsBusy as e:
        raise GenerateError(f"custom_logit_processor not loaded: {e}", 503, "service_unavailable") from None


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


def make_sampling_params(raw: dict[str, Any] | None, compile_patterns: bool = True) -> tuple[SamplingParams, bool]:
    """The verified params, and whether max_new_tokens is "up to the context length" (given as None).
    `compile_patterns=False` (the event loop) leaves compiling stop_regex to `check_in_worker`."""
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
        sp.verify(compile_patterns)
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


def refuse_tokenizer_work(obj: Any, sampling: SamplingParams) -> None:
    """--skip-tokenizer-init: token ids in and out; what needs the tokenizer is a 400 naming the flag."""
    if obj.text is not None or obj.messages is not None:
        what = "text prompts" if obj.text is not None else "chat messages"
        raise GenerateError(f"the server was started with --skip-tokenizer-init and cannot accept {what}: "
                            "give input_ids, or start it without --skip-tokenizer-init")
    needs = [name for name, on in (
        ("stop", bool(sampling.stop)), ("stop_regex", bool(sampling.stop_regex)),
        ("json_schema", sampling.json_schema is not None), ("regex", sampling.regex is not None),
        ("ebnf", sampling.ebnf is not None), ("structural_tag", sampling.structural_tag is not None),
        ("return_text_in_logprobs", sampling.return_text_in_logprobs),
        ("require_reasoning", obj.require_reasoning)) if on]
    if needs:
        raise GenerateError(f"{needs[0]} needs the tokenizer, which the server skips (--skip-tokenizer-init); "
                            "use stop_token_ids, or start it without --skip-tokenizer-init")


def refuse_local_paths(sources: list[Any], kind: str) -> None:
    """Without --allowed-local-media-path, a source that names a local file is a 400 (a video's frames
    are checked one by one)."""
    for i, src in enumerate(sources):
        for s in (src if kind == "video" and isinstance(src, (list, tuple)) else [src]):
            if isinstance(s, str) and is_local_path_source(s):
                raise GenerateError(
                    f"{kind} {i} ({s[:100]!r}) is not a data URL, an http(s) URL or valid base64 {kind} data, "
                    f"and local {kind} files are disabled (start the server with --allowed-local-media-path DIR)"
                )


def checked_dp_rank(rank: Any, dp: int) -> int | None:
    """`routed_dp_rank`: None, or a replica index of this server's --dp-size."""
    if rank is None:
        return None
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < dp:
        raise GenerateError(f"routed_dp_rank must be an integer in [0, {dp}) (this server runs --dp-size {dp}), "
                            f"got {rank!r}")
    return rank


# ----------------------------------------------------------------------------- lengths (after tokenizing)
def check_prompt_length(prompt_len: int, context_length: int, max_req_input_len: int | None,
                        max_total_num_tokens: int | None) -> None:
    """The prompt fits the context, the per-request input limit and the KV cache (with one output slot)."""
    if prompt_len == 0:
        raise GenerateError("the prompt is empty")
    if prompt_len >= context_length:  # upstream's wording: clients match on it
        raise GenerateError(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    if max_req_input_len is not None and prompt_len > max_req_input_len:
        raise GenerateError(
            f"the prompt is too long: {prompt_len} tokens, more than the {max_req_input_len} tokens "
            "one request may use"
        )
    if max_total_num_tokens is not None and prompt_len + 1 > max_total_num_tokens:
        raise GenerateError(
            f"the prompt is too long: {prompt_len} tokens need {prompt_len + 1} KV cache slots, but the KV "
            f"cache holds {max_total_num_tokens} tokens (--max-total-tokens)"
        )


def fit_max_new_tokens(prompt_len: int, asked: int, to_context: bool, explicit: bool, context_length: int,
                       max_total_num_tokens: int | None) -> int:
    """Output room: up to the context length, and within the KV cache, which must hold the prompt
    and every output token of this request at once. A default (`explicit` False; `to_context`: fill the
    context) is clamped to what fits; an explicit max_new_tokens beyond either is refused, naming the numbers."""
    room = context_length - prompt_len
    if explicit and asked > room:  # upstream's refusal, word for word
        raise GenerateError(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {prompt_len + asked} tokens: {prompt_len} tokens from the input messages "
            f"and {asked} tokens for the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )
    n = room if to_context else min(asked, room)
    if max_total_num_tokens is None:
        return n
    kv_room = max_total_num_tokens - prompt_len
    if n > kv_room and explicit:
        raise GenerateError(
            f"the request cannot fit in the KV cache: the prompt has {prompt_len} tokens and max_new_tokens is "
            f"{n}, {prompt_len + n} in all, but the KV cache holds {max_total_num_tokens} tokens "
            f"(--max-total-tokens); ask for at most {kv_room} new tokens"
        )
    return min(n, kv_room)


def refuse_grammar_without_backend(sampling: SamplingParams, grammar_backend: str) -> None:
    """--grammar-backend none: a constrained request is a 400 naming the flag, before it is built (the
    scheduler, which has no grammar queue then, would refuse it too)."""
    key = sampling.grammar_key()
    if key is not None and grammar_backend == "none":
        raise GenerateError(f"{key[0]} is not supported: this server runs with --grammar-backend none "
                            "(start it with --grammar-backend xgrammar for constrained output)")
