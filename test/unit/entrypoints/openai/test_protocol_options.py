"""Request fields for upstream's options on the OpenAI routes: chat takes `priority` and the image settings
under vLLM's (`mm_processor_kwargs`) or upstream's (`images_config`) name, one at a time; completions take
`priority` and refuse image settings (they have no images) instead of ignoring them."""

from __future__ import annotations

from sglang.srt.managers.field_policy import COMPLETION_REFUSED, check_fields
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]


def test_chat_image_settings_come_from_either_field_never_both():
    req = ChatCompletionRequest.model_validate({"messages": MESSAGES, "images_config": {"max_pixels": 4096}})
    assert req.media_kwargs() == ({"max_pixels": 4096}, "images_config") and req.unsupported() is None
    req = ChatCompletionRequest.model_validate({"messages": MESSAGES, "mm_processor_kwargs": {"min_pixels": 64}})
    assert req.media_kwargs() == ({"min_pixels": 64}, "mm_processor_kwargs")
    assert ChatCompletionRequest.model_validate({"messages": MESSAGES}).media_kwargs() == (None, "mm_processor_kwargs")
    both = ChatCompletionRequest.model_validate({"messages": MESSAGES, "images_config": {}, "mm_processor_kwargs": {}})
    assert "not both" in both.unsupported()


def test_priority_is_a_field_of_both_routes():
    assert ChatCompletionRequest.model_validate({"messages": MESSAGES, "priority": 4}).priority == 4
    assert CompletionRequest.model_validate({"prompt": "x", "priority": -1}).priority == -1


def test_completions_refuse_image_settings():
    for key in ("mm_processor_kwargs", "images_config"):
        problem = check_fields({"prompt": "x", key: {"max_pixels": 1}}, CompletionRequest.model_fields, COMPLETION_REFUSED)
        assert problem.startswith(f"{key} is not supported: completions take no images")
