"""sglang-router 0.3.2 re-serializes what it forwards: /generate gains `model: null` and its own fields at
their defaults, chat and completions gain theirs. These are the bodies it sent to a worker (captured from
the router in front of a recording server); each must be accepted as the client's request."""

from __future__ import annotations

import orjson

from sglang.srt.entrypoints.native_generate import native_requests
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

ROUTER_DEFAULTS = {"return_text_in_logprobs": False, "log_metrics": True, "return_hidden_states": False,
                   "background": False, "no_logs": False, "return_bytes": False, "return_entropy": False}
GENERATE = [
    {"text": "hello", "model": None, "sampling_params": {"max_new_tokens": 4}, "stream": False, **ROUTER_DEFAULTS},
    {"model": None, "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}, "stream": True, **ROUTER_DEFAULTS},
]
CHAT = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                                  {"type": "text", "text": "hi"}]}],
        "model": "m", "logprobs": False, "max_completion_tokens": 3, "stream": True, "no_stop_trim": False,
        "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
        "stream_reasoning": True, "return_hidden_states": False}
COMPLETION = {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": False, "echo": False, "no_stop_trim": False,
              "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}


def test_generate_bodies_the_router_forwards_are_the_clients_requests():
    for body in GENERATE:
        # what the client could have sent itself: the same, less the fields that only ask for defaults
        client = {k: v for k, v in body.items() if k not in ROUTER_DEFAULTS and k != "model"}
        client["return_text_in_logprobs"] = False
        (got,), _ = native_requests(body, 0.0)
        (want,), _ = native_requests(client, 0.0)
        assert got == want


def test_a_model_name_on_generate_is_refused_by_name():
    import pytest

    from sglang.srt.errors import GenerateError

    with pytest.raises(GenerateError, match="model"):
        native_requests({"text": "hi", "model": "some-model"}, 0.0)


def test_chat_and_completion_bodies_the_router_forwards_are_accepted():
    for serving_cls, body in ((OpenAIServingChat, CHAT), (OpenAIServingCompletion, COMPLETION)):
        serving = serving_cls(None, "default")
        req = serving._parse(orjson.dumps(body))
        assert len(serving._convert_to_internal_requests(req, 0.0)) == 1
