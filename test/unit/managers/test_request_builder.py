"""Pure helpers of the request path: chat message splitting, sampling-param parsing, and the
stop-string holdback that keeps streamed text from showing the start of a stop string."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang.srt.managers.chat_messages import split_chat_media
from sglang.srt.errors import GenerateError
from sglang.srt.managers.request_validation import make_sampling_params, merge_media_sources, refuse_tokenizer_work
from sglang.srt.utils.text import partial_match_len


def test_split_chat_media_keeps_order_and_renders_image_parts():
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:a"}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": "data:b"},
            {"type": "image"},
        ]},
    ]
    out, images, _ = split_chat_media(msgs)
    assert images == ["data:a", "data:b", None]
    assert out[1]["content"] == [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}, {"type": "image"}]
    assert msgs[1]["content"][0]["type"] == "image_url"  # the caller's messages are not modified
    assert merge_media_sources(images, ["pil"]) == ["data:a", "data:b", "pil"]
    with pytest.raises(GenerateError, match="1 image part"):
        merge_media_sources(images, [])


@pytest.mark.parametrize("msgs, match", [
    ([], "non-empty"),
    ([{"role": "wizard", "content": "x"}], "role"),
    ([{"role": "user", "content": 5}], "content"),
    ([{"role": "user", "content": [{"type": "video_url"}]}], "video_url"),
    ([{"role": "user", "content": [{"type": "audio_url"}]}], "audio_url"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "image_url.url"),
])
def test_split_chat_media_names_the_problem(msgs, match):
    with pytest.raises(ValueError, match=match):
        split_chat_media(msgs)


def test_make_sampling_params():
    sp, to_context = make_sampling_params({"max_new_tokens": None, "temperature": 0, "stop": "x", "top_p": None})
    assert to_context and sp.stop == ["x"] and sp.temperature == 0 and sp.top_p == 1.0
    sp, to_context = make_sampling_params({"max_new_tokens": 0, "return_logprob": True, "logprob_start_len": 0})
    assert sp.max_new_tokens == 0 and not to_context and sp.wants_input_logprobs  # prompt scoring
    for raw, match in (({"temprature": 1}, "temprature"), ({"top_k": 0}, "top_k"), ({"temperature": "hot"}, "temperature"), ([], "object"),
                       ({"max_new_tokens": -1}, "max_new_tokens must be a non-negative integer"),
                       ({"max_new_tokens": True}, "max_new_tokens"), ({"max_new_tokens": 0, "min_new_tokens": 1}, "min_new_tokens")):
        with pytest.raises(GenerateError, match=match):
            make_sampling_params(raw)


@given(text=st.text("abc", max_size=12), stops=st.lists(st.text("abc", min_size=1, max_size=4), max_size=3))
def test_holdback_is_the_longest_stop_prefix_suffix(text, stops):
    k = partial_match_len(text, stops)
    expected = max([j for s in stops for j in range(1, len(s)) if text.endswith(s[:j])], default=0)
    assert k == expected


def test_stop_regex_is_checked_where_the_request_enters():
    sp, _ = make_sampling_params({"stop_regex": "a[0-9]+"})
    assert sp.stop_regex == ["a[0-9]+"]
    for raw, match in (({"stop_regex": "a("}, "not a valid regular expression"), ({"stop_regex": "x*"}, "matches the empty string"), ({"stop_regex": r"\b"}, "matches the empty string"),
                       ({"stop_regex": [""]}, "non-empty"), ({"stop_regex": ["a"] * 17}, "at most 16"),
                       ({"no_stop_trim": "yes"}, "no_stop_trim must be true or false")):
        with pytest.raises(GenerateError, match=match):
            make_sampling_params(raw)


@pytest.mark.parametrize("kwargs, params, word", [
    ({"text": "hi"}, {}, "cannot accept text prompts"),
    ({"messages": [{"role": "user", "content": "hi"}]}, {}, "cannot accept chat messages"),
    ({"input_ids": [1]}, {"stop": "x"}, "stop needs the tokenizer"),
    ({"input_ids": [1]}, {"stop_regex": "x+"}, "stop_regex needs"),
    ({"input_ids": [1]}, {"json_schema": "{}"}, "json_schema needs"),
    ({"input_ids": [1]}, {"regex": "a"}, "regex needs"),
    ({"input_ids": [1]}, {"ebnf": "root ::= \"a\""}, "ebnf needs"),
    ({"input_ids": [1]}, {"return_logprob": True, "return_text_in_logprobs": True}, "return_text_in_logprobs needs"),
    ({"input_ids": [1], "require_reasoning": True}, {}, "require_reasoning needs"),
])
def test_skip_tokenizer_init_refuses_what_needs_the_tokenizer(kwargs, params, word):
    from sglang.srt.managers.io_struct import GenerateReqInput

    sampling, _ = make_sampling_params(params)
    with pytest.raises(GenerateError, match=word) as e:
        refuse_tokenizer_work(GenerateReqInput(sampling_params=params, **kwargs), sampling)
    assert "--skip-tokenizer-init" in str(e.value)
    ok, _ = make_sampling_params({"stop_token_ids": [7], "max_new_tokens": 3})
    refuse_tokenizer_work(GenerateReqInput(input_ids=[1, 2], image_data=["data:x"]), ok)  # no raise
