"""Tests for the local Qwen-compatible tokenizer (sglang.testing.tokenizer_builder)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang.testing import tokenizer_builder as tb
from sglang.testing.chat_template import QWEN25_DEFAULT_SYSTEM

transformers = pytest.importorskip("transformers")
from transformers import AutoTokenizer  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]

EXPECTED_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|file_sep|>": 151664,
}
FAMILIES = ["qwen3_vl", "qwen2_5_vl"]
TEXTS = [
    "Hello, world! This is a simple ASCII sentence with numbers 12345 and symbols #$%^&*().",
    "  leading spaces, trailing spaces   \n\n\ttabs and\r\nnewlines\n",
    "Café naïve façade — “quotes” … 你好，世界 こんにちは 안녕하세요 Привет 😀🎉 x² ∑ √2",
    "def f(x):\n    return x ** 2  # comment\n",
    "",
]


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(f"tok_{fam}")
        tb.write_tokenizer_files(d, fam, model_max_length=4096)
        out[fam] = d
    return out


@pytest.fixture(scope="module")
def hf_toks(tok_dirs):
    transformers.logging.set_verbosity_error()
    return {fam: AutoTokenizer.from_pretrained(d) for fam, d in tok_dirs.items()}


def test_training_is_fast_and_small():
    tb._trained_model_json.cache_clear()
    tb.tokenizer_json.cache_clear()
    t0 = time.perf_counter()
    tb.tokenizer_json("qwen3_vl")
    assert time.perf_counter() - t0 < 5.0
    n = tb.trained_vocab_size()
    assert 1000 < n <= tb.TRAINED_VOCAB_SIZE


@pytest.mark.parametrize("family", FAMILIES)
def test_special_token_ids_raw(family):
    tok = tb.build_tokenizer(family)
    for content, tid in EXPECTED_IDS.items():
        assert tok.token_to_id(content) == tid
        assert tok.id_to_token(tid) == content
    extra = {"<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667, "</think>": 151668}
    for content, tid in extra.items():
        assert tok.token_to_id(content) == (tid if family == "qwen3_vl" else None)
    # a byte-level vocabulary below, fillers up to the first special id
    n = tb.trained_vocab_size()
    assert tok.id_to_token(n) == "<|reserved_%d|>" % n
    assert tok.id_to_token(151642) == "<|reserved_151642|>"
    assert tok.get_vocab_size() == (151669 if family == "qwen3_vl" else 151665)


@pytest.mark.parametrize("family", FAMILIES)
def test_autotokenizer_loads(hf_toks, family):
    tok = hf_toks[family]
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert len(tok) == (151669 if family == "qwen3_vl" else 151665)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.bos_token is None
    assert tok.model_max_length == 4096
    for content, tid in EXPECTED_IDS.items():
        assert tok.convert_tokens_to_ids(content) == tid
    specials = set(tok.all_special_tokens)
    assert {"<|im_start|>", "<|im_end|>", "<|image_pad|>", "<|vision_start|>", "<|endoftext|>"} <= specials
    assert "<tool_call>" not in specials  # not special, as in Qwen


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_fixed(hf_toks, text):
    raw = _raw_tokenizer("qwen3_vl")
    for tok in hf_toks.values():
        ids = tok(text, add_special_tokens=True)["input_ids"]
        assert ids == raw.encode(text).ids  # transformers and the raw tokenizer agree
        assert tok.decode(ids) == unicodedata.normalize("NFC", text)
        assert all(i < tb.trained_vocab_size() for i in ids)  # fillers/specials never emitted for plain text


def test_round_trip_special_tokens(hf_toks):
    tok = hf_toks["qwen3_vl"]
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Hi there<|im_end|>\n<|endoftext|>"
    ids = tok(text)["input_ids"]
    assert ids[0] == 151644 and ids[-1] == 151643
    assert ids[3:6] == [151652, 151655, 151653]
    assert ids.count(151645) == 1
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi there\n"
    # A special token is one id even when glued to text.
    assert tok("abc<|image_pad|><|image_pad|>def")["input_ids"].count(151655) == 2


@functools.lru_cache(maxsize=None)
def _raw_tokenizer(family: str):
    return tb.build_tokenizer(family)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=80))
def test_round_trip_property(text):
    tok = _raw_tokenizer("qwen2_5_vl")
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_files_written(tok_dirs):
    d = tok_dirs["qwen3_vl"]
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "Qwen2Tokenizer"
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>"
    assert cfg["chat_template"] == (d / "chat_template.jinja").read_text()
    assert cfg["added_tokens_decoder"]["151655"]["content"] == "<|image_pad|>"
    stm = json.loads((d / "special_tokens_map.json").read_text())
    assert stm["eos_token"]["content"] == "<|im_end|>"
    tj = json.loads((d / "tokenizer.json").read_text())
    assert tj["model"]["type"] == "BPE" and tj["decoder"]["type"] == "ByteLevel"
    assert [t["id"] for t in tj["added_tokens"]] == list(range(151643, 151669))


def test_deterministic_across_processes():
    here = hashlib.sha256(tb.tokenizer_json("qwen3_vl").encode()).hexdigest()
    code = (
        "import hashlib; from sglang.testing.tokenizer_builder import tokenizer_json;"
        "print(hashlib.sha256(tokenizer_json('qwen3_vl').encode()).hexdigest())"
    )
    env = dict(os.environ, PYTHONHASHSEED="4242", RAYON_NUM_THREADS="1",
               PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == here


# ----------------------------------------------------------------------------- chat template


def _render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_chat_template_images_in_order(hf_toks):
    tok = hf_toks["qwen3_vl"]
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare "},
                {"type": "image", "image": "a.png"},
                {"type": "text", "text": " with "},
                {"type": "image_url", "image_url": {"url": "http://example.com/b.png"}},
                {"type": "text", "text": " please."},
            ],
        }
    ]
    out = _render(tok, messages, add_generation_prompt=True)
    img = "<|vision_start|><|image_pad|><|vision_end|>"
    assert out == f"<|im_start|>user\nCompare {img} with {img} please.<|im_end|>\n<|im_start|>assistant\n"
    assert _render(tok, messages, add_generation_prompt=False).endswith("please.<|im_end|>\n")

    numbered = _render(tok, messages, add_generation_prompt=False, add_vision_id=True)
    assert f"Compare Picture 1: {img} with Picture 2: {img} please." in numbered


def test_chat_template_multi_turn_and_system(hf_toks):
    tok = hf_toks["qwen3_vl"]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [{"type": "text", "text": "And this?"}, {"type": "video"}]},
    ]
    out = _render(tok, messages, add_generation_prompt=True)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is it?<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"
        "<|im_start|>user\nAnd this?<|vision_start|><|video_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    enc = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = enc["input_ids"] if hasattr(enc, "keys") else enc
    gen_prompt = tok("<|im_start|>assistant\n")["input_ids"]
    assert ids.count(151655) == 1 and ids.count(151656) == 1
    assert ids[0] == 151644 and ids[-len(gen_prompt):] == gen_prompt


def test_chat_template_default_system_qwen25(hf_toks):
    out = _render(hf_toks["qwen2_5_vl"], [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert out == (
        f"<|im_start|>system\n{QWEN25_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    out3 = _render(hf_toks["qwen3_vl"], [{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    assert out3 == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_tools(hf_toks):
    tok = hf_toks["qwen3_vl"]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "20C"},
    ]
    out = _render(tok, messages, tools=tools, add_generation_prompt=True)
    assert out.startswith("<|im_start|>system\n") and '"name": "get_weather"' in out
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n' in out
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n20C\n</tool_response><|im_end|>\n" in out
    assert out.endswith("<|im_start|>assistant\n")
