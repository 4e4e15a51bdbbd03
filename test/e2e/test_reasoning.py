"""Reasoning through the openai client (--reasoning-parser qwen3) on the random-weight tiny model: an
assistant turn continued inside `<think>` (continue_final_message) makes the whole output reasoning,
streamed or not, equal to the raw text separate_reasoning false returns; enable_thinking false reaches the
template; a constraint applies only after the reasoning ends (`</think>` forced by logit_bias), so the
content matches it and the reasoning is free; continuous_usage_stats puts usage in every chunk."""

from __future__ import annotations

import re

import openai
import pytest
import requests

THINK_END = 151668  # </think>
THINKING = [{"role": "user", "content": "Think first."}, {"role": "assistant", "content": "<think>\nLet me see"}]


@pytest.fixture(scope="module")
def oai(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _chat(oai, messages=THINKING, **extra):
    kw = {k: extra.pop(k) for k in ("logit_bias", "stream", "stream_options", "max_tokens") if k in extra}
    kw.setdefault("max_tokens", 16)
    cont = {"continue_final_message": True} if messages is THINKING else {}
    return oai.chat.completions.create(model="default", messages=messages, temperature=0, extra_body={**cont, **extra},
                                       **kw)


def test_continued_thinking_is_all_reasoning(oai):
    raw = _chat(oai, separate_reasoning=False).choices[0].message
    assert raw.reasoning_content is None and raw.content and not raw.content.startswith("<think>")
    msg = _chat(oai).choices[0].message
    assert msg.content is None and msg.reasoning_content == raw.content.strip()


def test_streamed_reasoning_deltas(oai):
    whole = _chat(oai).choices[0].message.reasoning_content
    pieces = [c.choices[0].delta for c in _chat(oai, stream=True) if c.choices]
    assert "".join(d.reasoning_content or "" for d in pieces) == whole
    assert all(d.content in (None, "") and d.tool_calls is None for d in pieces)
    one = [c.choices[0].delta.reasoning_content for c in _chat(oai, stream=True, stream_reasoning=False) if c.choices]
    assert [r for r in one if r] == [whole]  # stream_reasoning false: one piece, at the end


def test_enable_thinking_false_reaches_the_template(oai):
    plain = [{"role": "user", "content": "Think first."}]
    off = _chat(oai, plain, chat_template_kwargs={"enable_thinking": False})
    on = _chat(oai, plain)
    assert off.usage.prompt_tokens > on.usage.prompt_tokens  # the closed <think></think> block
    assert off.choices[0].message.reasoning_content is None and off.choices[0].message.content


def test_constraint_applies_after_the_reasoning(oai):
    free = _chat(oai, regex="[0-9]{3}", max_tokens=24).choices[0]  # never leaves the reasoning: never masked
    assert free.finish_reason == "length" and free.message.content is None
    assert not re.fullmatch("[0-9 ]*", free.message.reasoning_content)
    ended = _chat(oai, regex="[0-9]{3}", max_tokens=24, logit_bias={str(THINK_END): 100}).choices[0]
    assert ended.finish_reason == "stop" and ended.message.reasoning_content is None
    assert re.fullmatch("[0-9]{3}", ended.message.content)


def test_continuous_usage_stats(oai):
    chunks = list(_chat(oai, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages)
    done = [u.completion_tokens for u in usages]
    # growing chunk by chunk; the finish chunk's count is the final usage chunk's
    assert done == sorted(done) and done[-1] == done[-2] > done[0]
    assert usages[0].prompt_tokens == usages[-1].prompt_tokens > 0
