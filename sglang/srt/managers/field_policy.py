"""Which top-level request fields each endpoint takes: a field is honoured, refused with a 400 naming it,
or unknown (a 400 in OpenAI's words: "Unrecognized request argument supplied: NAME"). Nothing is
ignored silently.

A refused field is one upstream SGLang 0.5.23 or the OpenAI API defines and this server does not
implement. It is refused only when it asks for something: a client that sends its default ("off")
value gets what it asked for, so it passes. The tables are data; the endpoints' own models say what is
honoured (test/unit/entrypoints/test_field_walk.py walks upstream's field lists against them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

UNRECOGNIZED = "Unrecognized request argument supplied: {}"


@dataclass(frozen=True)
class Refusal:
    why: str
    # values that ask for nothing (the field's default); any other value is refused
    off: tuple[Any, ...] = (None,)
    # or a predicate deciding it (e.g. a list of harmless values)
    is_off: Callable[[Any], bool] | None = None

    def refuses(self, value: Any) -> bool:
        if self.is_off is not None:
            return not self.is_off(value)
        return not any(value is o or (type(value) is type(o) and value == o) for o in self.off)


def _only(*allowed: Any) -> Callable[[Any], bool]:
    """Off when None or a list of values that are all in `allowed` (e.g. modalities ["text"])."""
    return lambda v: v is None or (isinstance(v, list) and all(x in allowed for x in v))


_NO_LORA = Refusal("LoRA adapters are not supported")
_NO_SESSIONS = Refusal("sessions are not supported")
_NO_PD = Refusal("prefill-decode disaggregation is not supported")
_NO_CACHE_SALT = Refusal("cache salts and extra cache keys are not supported")
_NO_HIDDEN = Refusal("hidden states are not returned by this server", (False, None))
_NO_EXPERTS = Refusal("routed experts: the served models are not mixture-of-experts", (False, None))
_NO_DYNAMIC_PATCH = Refusal("dynamic patch counts are an InternVL setting: use images_config max_pixels")
_NO_AUDIO = Refusal("audio input is not supported", (False, None))
_NO_LABELS = Refusal("custom metric labels are not supported")
_NO_NGRAM = Refusal("n-gram speculative decoding is not supported")
_NO_TOKEN_IDS = Refusal("token ids in OpenAI responses are not supported: use /generate (output_ids)", (False, None))

# fields upstream's OpenAI requests (chat and completions) share
_OPENAI_COMMON: dict[str, Refusal] = {
    "lora_path": _NO_LORA,
    "session_id": _NO_SESSIONS,
    "session_params": _NO_SESSIONS,
    "return_hidden_states": _NO_HIDDEN,
    "return_routed_experts": _NO_EXPERTS,
    "routed_experts_start_len": Refusal(_NO_EXPERTS.why, (0, None)),
    "return_cached_tokens_details": Refusal(
        "return_cached_tokens_details is not supported: usage.prompt_tokens_details.cached_tokens is always sent",
        (False, None)),
    "return_token_ids": _NO_TOKEN_IDS,
    "bootstrap_host": _NO_PD,
    "bootstrap_port": _NO_PD,
    "bootstrap_room": _NO_PD,
    "disagg_prefill_dp_rank": _NO_PD,
    "extra_key": _NO_CACHE_SALT,
    "cache_salt": _NO_CACHE_SALT,
    "ngram_corpus_id": _NO_NGRAM,
    "custom_labels": _NO_LABELS,
}

CHAT_REFUSED: dict[str, Refusal] = {
    **_OPENAI_COMMON,
    "functions": Refusal("functions (deprecated by OpenAI) are not supported"),
    "function_call": Refusal("function_call (deprecated by OpenAI) is not supported", (None, "none", "auto")),
    "reasoning_effort": Refusal("reasoning_effort is not supported: use chat_template_kwargs (enable_thinking)"),
    "reasoning": Refusal("reasoning is not supported: use chat_template_kwargs (enable_thinking)"),
    "return_prompt_token_ids": _NO_TOKEN_IDS,
    "return_meta_info": Refusal("return_meta_info is not supported: use /generate (meta_info)", (False, None)),
    "task": Refusal("quick instruction tasks are not supported"),
    "max_dynamic_patch": _NO_DYNAMIC_PATCH,
    "min_dynamic_patch": _NO_DYNAMIC_PATCH,
    "use_audio_in_video": _NO_AUDIO,
    "input_ids": Refusal("input_ids on chat is not supported: send token ids to /v1/completions or /generate"),
    # the OpenAI API's own fields
    "store": Refusal("stored completions are not supported", (False, None)),
    "metadata": Refusal("metadata is for stored completions, which are not supported"),
    "service_tier": Refusal("service tiers are not supported", (None, "auto", "default")),
    "modalities": Refusal("only text output is supported", is_off=_only("text")),
    "audio": Refusal("audio output is not supported"),
    "prediction": Refusal("predicted outputs are not supported"),
    "web_search_options": Refusal("web search is not supported"),
    "verbosity": Refusal("verbosity is not supported"),
    "prompt_cache_key": Refusal("prompt_cache_key is not supported: the prefix cache is automatic"),
    "safety_identifier": Refusal("safety_identifier is not supported"),
}

COMPLETION_REFUSED: dict[str, Refusal] = {
    **_OPENAI_COMMON,
    "images_config": Refusal("images_config is not supported: completions take no images "
                             "(use /v1/chat/completions or /generate)"),
    "mm_processor_kwargs": Refusal("mm_processor_kwargs is not supported: completions take no images "
                                   "(use /v1/chat/completions or /generate)"),
}

# the native /generate body (upstream's GenerateReqInput)
GENERATE_REFUSED: dict[str, Refusal] = {
    "input_embeds": Refusal("input_embeds is not supported: give text or input_ids"),
    "audio_data": Refusal("audio input is not supported", is_off=lambda v: v is None or v == []),
    "use_audio_in_video": _NO_AUDIO,
    "modalities": Refusal("only image and video modalities are supported",
                          is_off=_only("image", "multi-images", "video")),
    "token_ids_logprob": Refusal("token_ids_logprob is not supported: use top_logprobs_num"),
    "log_metrics": Refusal("log_metrics false is not supported", (True, None)),
    "return_hidden_states": _NO_HIDDEN,
    "return_routed_experts": _NO_EXPERTS,
    "return_indexer_topk": _NO_EXPERTS,
    "routed_experts_start_len": Refusal(_NO_EXPERTS.why, (0, None)),
    "session_params": _NO_SESSIONS,
    "lora_path": _NO_LORA,
    "lora_id": _NO_LORA,
    "positional_embed_overrides": Refusal("positional_embed_overrides is not supported"),
    "bootstrap_host": _NO_PD,
    "bootstrap_port": _NO_PD,
    "bootstrap_room": _NO_PD,
    "bootstrap_pair_key": _NO_PD,
    "decode_tp_size": _NO_PD,
    "need_wait_for_mm_inputs": _NO_PD,
    "num_items_assigned": _NO_PD,
    "disagg_prefill_dp_rank": _NO_PD,
    "background": Refusal("background requests are not supported", (False, None)),
    "conversation_id": Refusal("conversation_id is not supported"),
    "extra_key": _NO_CACHE_SALT,
    "routing_key": Refusal("routing_key is not supported"),
    "no_logs": Refusal("no_logs is not supported", (False, None)),
    "custom_labels": _NO_LABELS,
    "return_bytes": Refusal("return_bytes is not supported", (False, None)),
    "return_entropy": Refusal("return_entropy is not supported", (False, None)),
    "external_trace_header": Refusal("trace headers are not supported"),
    "received_time": Refusal("received_time is set by the server"),
    "max_dynamic_patch": _NO_DYNAMIC_PATCH,
    "min_dynamic_patch": _NO_DYNAMIC_PATCH,
    "image_max_dynamic_patch": _NO_DYNAMIC_PATCH,
    "video_max_dynamic_patch": _NO_DYNAMIC_PATCH,
    "multi_item_delimiter_indices": Refusal("multi-item scoring is not supported"),
    # sglang-router forwards /generate bodies with its own fields at their defaults, "model": null among them
    "model": Refusal("/generate serves this server's model: leave model out or null"),
}

# keys of /generate's sampling_params that upstream's SamplingParams defines and this server refuses
SAMPLING_REFUSED: dict[str, Refusal] = {
    "spaces_between_special_tokens": Refusal("spaces_between_special_tokens false is not supported", (True, None)),
    "stream_interval": Refusal("a per-request stream_interval is not supported: the server's --stream-interval applies"),
}


def refusal_message(name: str, refusal: Refusal) -> str:
    """The 400's message: always names the field."""
    return refusal.why if refusal.why.startswith(name + " ") else f"{name}: {refusal.why}"


def check_fields(body: dict[str, Any], honoured: Iterable[str], refused: dict[str, Refusal],
                 unknown_message: str = UNRECOGNIZED) -> str | None:
    """The first problem with `body`'s keys, as a message naming the field, or None. Honoured fields
    win over the refusal table (so an endpoint that learns a field only has to declare it)."""
    honoured = set(honoured)
    for name, value in body.items():
        if name in honoured:
            continue
        refusal = refused.get(name)
        if refusal is None:
            return unknown_message.format(name)
        if refusal.refuses(value):
            return refusal_message(name, refusal)
    return None
