"""Every top-level field of upstream SGLang's requests (ChatCompletionRequest, CompletionRequest, the native
GenerateReqInput and its SamplingParams) and of OpenAI's chat API, sent with a value that asks for
something, is either honoured (the request the engine receives changes, or the field only shapes the
response: RESPONSE_SIDE says how) or refused with a 400 whose message names it. Any other field is
refused in OpenAI's words. The field lists are upstream's, kept here as data."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace
from typing import Any

import pytest

from sglang.srt.managers.field_policy import UNRECOGNIZED
from sglang.srt.entrypoints.native_generate import native_requests
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.errors import GenerateError
from sglang.srt.managers.request_validation import make_sampling_params

MESSAGES = [{"role": "user", "content": "hi"}]
SCHEMA = '{"type": "object"}'
EBNF = 'root ::= "a"'
DATA_URL = "data:image/png;base64,iVBORw0KGgo="
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

# a value asking for something; a tuple (value, companions) also sends fields it needs
CHAT: dict[str, Any] = {
    # upstream 0.5.23 ChatCompletionRequest
    "model": "other-name", "frequency_penalty": 0.5, "logit_bias": {"5": 1.0}, "logprobs": True,
    "top_logprobs": (2, {"logprobs": True}), "max_tokens": 7, "max_completion_tokens": 7, "n": 2,
    "presence_penalty": 0.5, "response_format": {"type": "json_object"}, "seed": 3, "stop": ["x"], "stream": True,
    "stream_options": ({"include_usage": True}, {"stream": True}), "temperature": 0.5, "top_p": 0.5, "user": "u1",
    # with tools, on a server whose template has a tool-call format: refused without them, these fields
    # would pass the walk by naming themselves in "needs tools" (parallel_tool_calls was ignored unseen)
    "tools": TOOLS, "tool_choice": ("required", {"tools": TOOLS}), "parallel_tool_calls": (False, {"tools": TOOLS}),
    "return_hidden_states": True,
    "return_routed_experts": True, "routed_experts_start_len": 3, "return_cached_tokens_details": True,
    "return_prompt_token_ids": True, "return_token_ids": True, "return_meta_info": True, "reasoning_effort": "low",
    "reasoning": {"effort": "low"}, "task": "title", "top_k": 5, "min_p": 0.1, "min_tokens": 2, "regex": "a+",
    "ebnf": EBNF, "repetition_penalty": 1.2, "stop_token_ids": [5], "stop_regex": "x+", "no_stop_trim": True,
    "ignore_eos": True, "continue_final_message": True, "skip_special_tokens": False, "lora_path": "adapter",
    "session_id": "s", "session_params": {"id": "s"}, "separate_reasoning": False, "stream_reasoning": False,
    "chat_template_kwargs": {"enable_thinking": False}, "max_dynamic_patch": 4, "min_dynamic_patch": 1,
    "use_audio_in_video": True, "images_config": {"max_pixels": 4096}, "custom_logit_processor": "p",
    "custom_params": {"a": 1}, "input_ids": [1, 2], "rid": "abc", "extra_key": "k", "cache_salt": "salt",
    "ngram_corpus_id": "c", "priority": 3, "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1,
    "routed_dp_rank": 0, "disagg_prefill_dp_rank": 0, "data_parallel_rank": 0,
    # vLLM's names and ours
    "mm_processor_kwargs": {"max_pixels": 4096}, "json_schema": SCHEMA, "guided_json": SCHEMA, "guided_regex": "a+",
    "guided_choice": ["a", "b"], "guided_grammar": EBNF,
    # the OpenAI API's own
    "store": True, "metadata": {"k": "v"}, "service_tier": "flex", "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"}, "prediction": {"type": "content", "content": "x"},
    "web_search_options": {}, "functions": [{"name": "f"}], "function_call": {"name": "f"}, "verbosity": "low",
    "prompt_cache_key": "k", "safety_identifier": "s",
}

COMPLETION: dict[str, Any] = {
    "model": "other-name", "best_of": 2, "echo": True, "frequency_penalty": 0.5, "logit_bias": {"5": 1.0},
    "logprobs": 2, "max_tokens": 5, "n": 2, "presence_penalty": 0.5, "seed": 3, "stop": "x", "stream": True,
    "stream_options": ({"include_usage": True}, {"stream": True}), "suffix": "end", "temperature": 0.5,
    "top_p": 0.5, "user": "u1", "return_hidden_states": True, "return_routed_experts": True,
    "routed_experts_start_len": 3, "return_cached_tokens_details": True, "return_token_ids": True, "top_k": 5,
    "min_p": 0.1, "min_tokens": 2, "json_schema": SCHEMA, "regex": "a+", "ebnf": EBNF, "repetition_penalty": 1.2,
    "stop_token_ids": [5], "stop_regex": "x+", "no_stop_trim": True, "ignore_eos": True, "skip_special_tokens": False,
    "lora_path": "adapter", "session_id": "s", "session_params": {"id": "s"},
    "response_format": {"type": "json_object"}, "custom_params": {"a": 1}, "custom_logit_processor": "p",
    "images_config": {"max_pixels": 4096}, "bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": 1,
    "routed_dp_rank": 0, "disagg_prefill_dp_rank": 0, "data_parallel_rank": 0, "rid": "abc", "extra_key": "k",
    "cache_salt": "salt", "ngram_corpus_id": "c", "priority": 3, "custom_labels": {"team": "a"},
    "mm_processor_kwargs": {"max_pixels": 4096}, "guided_json": SCHEMA, "guided_regex": "a+",
    "guided_choice": ["a", "b"], "guided_grammar": EBNF,
}

GENERATE: dict[str, Any] = {
    "input_ids": ([1, 2, 3], {"text": None}), "input_embeds": [[0.1, 0.2]], "image_data": DATA_URL,
    "video_data": "clip.mp4", "audio_data": "a.wav", "use_audio_in_video": True,
    "sampling_params": {"temperature": 0.5}, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
    "token_ids_logprob": [1], "return_text_in_logprobs": True, "stream": True, "log_metrics": False,
    "return_hidden_states": True, "return_routed_experts": True, "return_indexer_topk": True,
    "routed_experts_start_len": 3, "modalities": ["audio"], "session_params": {"id": "s"}, "lora_path": "adapter",
    "lora_id": "x", "custom_logit_processor": "p", "positional_embed_overrides": [1], "bootstrap_host": "h",
    "bootstrap_port": 1, "bootstrap_room": 1, "bootstrap_pair_key": "k", "decode_tp_size": 2,
    "require_reasoning": True, "routed_dp_rank": 0, "disagg_prefill_dp_rank": 0, "data_parallel_rank": 0,
    "background": True, "conversation_id": "c", "priority": 3, "extra_key": "k", "routing_key": "r", "no_logs": True,
    "custom_labels": {"team": "a"}, "return_bytes": True, "return_entropy": True, "external_trace_header": {"a": "b"},
    "received_time": 1.0, "need_wait_for_mm_inputs": True, "num_items_assigned": {"image": [1]},
    "max_dynamic_patch": 4, "min_dynamic_patch": 1, "image_max_dynamic_patch": 4, "video_max_dynamic_patch": 4,
    "multi_item_delimiter_indices": [[1]], "rid": "abc",
    "images_config": {"max_pixels": 4096}, "mm_processor_kwargs": {"max_pixels": 4096},
}

SAMPLING: dict[str, Any] = {
    "max_new_tokens": 5, "stop": ["x"], "stop_token_ids": [5], "stop_regex": "x+", "temperature": 0.5, "top_p": 0.5,
    "top_k": 5, "min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.2,
    "min_new_tokens": 1, "json_schema": SCHEMA, "regex": "a+", "ebnf": EBNF,
    "structural_tag": '{"type": "structural_tag"}', "ignore_eos": True, "skip_special_tokens": False,
    "spaces_between_special_tokens": False, "no_stop_trim": True, "custom_params": {"a": 1}, "stream_interval": 2,
    "logit_bias": {"5": 1.0}, "sampling_seed": 3, "min_tokens": 1, "seed": 3,
}

# honoured fields that shape only the response, not the request the engine runs
RESPONSE_SIDE = {
    "model": "echoed as the response's model name",
    "stream_options": "include_usage adds the usage chunk",
    "echo": "puts the prompt before the completion text",
    "user": "an end-user id for the client's own bookkeeping (OpenAI: abuse monitoring), accepted as OpenAI does",
}


def _split(sample: Any) -> tuple[Any, dict[str, Any]]:
    return sample if isinstance(sample, tuple) else (sample, {})


def _openai_outcome(serving, base: dict[str, Any], extra: dict[str, Any]) -> list[dict] | str:
    body = {k: v for k, v in {**base, **extra}.items() if v is not None}
    try:
        req = serving._parse(__import__("orjson").dumps(body))
        copies = [c for o in serving._convert_to_internal_requests(req, 0.0) for c in o.parallel_copies()]
        outcome = [_as_engine_sees_it(c) for c in copies]
    except (GenerateError, ValueError) as e:
        return getattr(e, "message", str(e))
    if isinstance(serving, OpenAIServingChat):  # and how the output becomes the response (tool calls kept)
        outcome.append(dataclasses.asdict(serving._output_processor(req, SimpleNamespace(prompts=[]), 0).options))
    return outcome


def _chat_serving() -> OpenAIServingChat:
    """A chat server whose template has Qwen's tool-call format and a reasoning parser, so tool and
    reasoning fields can be honoured (without a parser separate_reasoning has nothing to do)."""
    tm = SimpleNamespace(server_args=SimpleNamespace(tool_call_parser=None, reasoning_parser="qwen3"),
                         builder=SimpleNamespace(tokenizer=SimpleNamespace(chat_template="{% if tools %}<tool_call>{% endif %}")))
    return OpenAIServingChat(tm, "default")


def _as_engine_sees_it(obj) -> dict[str, Any]:
    """The internal request with its sampling parameters checked and parsed as the tokenizer does."""
    out = dataclasses.asdict(obj)
    out["sampling_params"] = dataclasses.asdict(make_sampling_params(obj.sampling_params)[0])
    return out


def _walk(outcome, fields: dict[str, Any]):
    baseline = outcome({})
    assert not isinstance(baseline, str), baseline
    for name, sample in fields.items():
        value, companions = _split(sample)
        with_field = outcome({**companions, name: value})
        if isinstance(with_field, str):
            assert re.search(rf"\b{name}\b", with_field), f"{name}: refused without naming it: {with_field!r}"
            continue
        if name in RESPONSE_SIDE:
            continue
        assert with_field != outcome(companions), f"{name}={value!r} is accepted but changes nothing (silently ignored)"


@pytest.mark.parametrize("serving_cls, base, fields", [
    (OpenAIServingChat, {"messages": MESSAGES}, CHAT),
    (OpenAIServingCompletion, {"prompt": "hi"}, COMPLETION),
], ids=["chat", "completions"])
def test_every_upstream_openai_field_is_honoured_or_refused_by_name(serving_cls, base, fields):
    serving = _chat_serving() if serving_cls is OpenAIServingChat else serving_cls(None, "default")
    _walk(lambda extra: _openai_outcome(serving, base, extra), fields)


def test_every_upstream_generate_field_is_honoured_or_refused_by_name():
    def outcome(extra: dict[str, Any]) -> list[dict] | str:
        body = {k: v for k, v in {"text": "hi", **extra}.items() if v is not None}
        try:
            objs, _ = native_requests(body, 0.0)
        except GenerateError as e:
            return e.message
        return [_as_engine_sees_it(o) for o in objs]

    _walk(outcome, GENERATE)


def test_every_upstream_sampling_parameter_is_honoured_or_refused_by_name():
    def outcome(extra: dict[str, Any]) -> Any:
        if "n" in extra:
            return extra["n"]
        try:
            return dataclasses.asdict(make_sampling_params(extra)[0])
        except GenerateError as e:
            return e.message

    _walk(outcome, SAMPLING)
    objs, _ = native_requests({"text": "hi", "sampling_params": {"n": 3}}, 0.0)
    assert len(objs) == 3  # n: that many samples


@pytest.mark.parametrize("serving_cls, base", [(OpenAIServingChat, {"messages": MESSAGES}),
                                               (OpenAIServingCompletion, {"prompt": "hi"})], ids=["chat", "completions"])
def test_unknown_fields_are_refused_in_openais_words(serving_cls, base):
    serving = serving_cls(None, "default")
    assert _openai_outcome(serving, base, {"temprature": 0.5}) == UNRECOGNIZED.format("temprature")


def test_unknown_generate_fields_are_refused_in_openais_words():
    with pytest.raises(GenerateError, match="Unrecognized request argument supplied: sampling_param$"):
        native_requests({"text": "hi", "sampling_param": {}}, 0.0)


def test_a_refused_field_sent_with_its_default_passes():
    serving = OpenAIServingChat(None, "default")
    off = {"tool_choice": "none", "parallel_tool_calls": True, "return_hidden_states": False, "store": False,
           "modalities": ["text"], "service_tier": "auto", "separate_reasoning": True, "lora_path": None}
    assert not isinstance(_openai_outcome(serving, {"messages": MESSAGES}, off), str)
    objs, _ = native_requests({"text": "hi", "video_data": [], "log_metrics": True, "modalities": ["image"],
                               "sampling_params": {"spaces_between_special_tokens": True}}, 0.0)
    assert len(objs) == 1
