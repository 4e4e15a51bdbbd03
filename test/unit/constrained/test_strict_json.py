"""A json_schema answer parses under RFC 8259 whatever the backend: raw control characters (U+0000-U+001F)
never enter a JSON string. xgrammar 0.2.9 let them into length-bounded strings ({"maxLength": 20}), so the
server once answered {"name": "Earlyalve\\x1dua"}, which json.loads refuses."""

from __future__ import annotations

import json

import pytest

from sglang.srt.constrained.llguidance_backend import LLGuidanceBackend
from sglang.srt.constrained.xgrammar_backend import JsonOptions, XGrammarBackend

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]},
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}, "required": ["name"]},
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 5}}},
     "required": ["tags"]},
]
PREFIX = {0: '{"name": "ab', 1: '{"name": "ab', 2: '{"name": "ab', 3: '{"tags": ["ab'}


def _allowed_after(backend, tok, schema, prefix: str) -> set[int]:
    import torch

    m = backend.matcher(backend.compile(("json_schema", json.dumps(schema))))
    for t in tok.encode(prefix, add_special_tokens=False):
        assert m.accept_token(t), (prefix, t)
    n = backend.vocab_size
    mask = torch.zeros((n + 31) // 32, dtype=torch.int32)
    m.fill_next_token_bitmask(mask.view(1, -1))
    return {i for i in range(n) if (int(mask[i // 32]) >> (i % 32)) & 1}


@pytest.fixture(scope="module")
def tok_and_path(tiny_model_dir):
    from transformers import AutoTokenizer

    path = str(tiny_model_dir("qwen3-vl-tiny"))
    return AutoTokenizer.from_pretrained(path), path


@pytest.mark.parametrize("k", range(len(SCHEMAS)))
@pytest.mark.parametrize("opts", [JsonOptions(), JsonOptions(True, None), JsonOptions(False, 2)])
def test_no_token_with_a_raw_control_character_inside_a_string(tok_and_path, k, opts):
    tok, path = tok_and_path
    vocab = json.load(open(f"{path}/config.json"))["text_config"]["vocab_size"]
    backend = XGrammarBackend(path, vocab, json_options=opts)
    allowed = _allowed_after(backend, tok, SCHEMAS[k], PREFIX[k])
    control = {i for i in allowed if any(ord(c) < 0x20 for c in tok.decode([i]))}
    assert not control, [repr(tok.decode([i])) for i in sorted(control)[:5]]
    plain = tok.encode("c", add_special_tokens=False)[0]
    assert plain in allowed  # the string still goes on


def test_llguidance_refuses_them_too(tok_and_path):
    tok, path = tok_and_path
    vocab = json.load(open(f"{path}/config.json"))["text_config"]["vocab_size"]
    backend = LLGuidanceBackend(path, vocab)
    allowed = _allowed_after(backend, tok, SCHEMAS[0], PREFIX[0])
    assert not {i for i in allowed if any(ord(c) < 0x20 for c in tok.decode([i]))}
