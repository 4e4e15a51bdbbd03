"""Structural tags as request fields: xgrammar's form passes as is, upstream's older structures/triggers
form becomes the equivalent triggered tags, malformed ones are refused naming the field; both compile
and accept what they describe."""

from __future__ import annotations

import json

import pytest

from sglang.srt.constrained.request_fields import ConstraintError, constraint_params, structural_tag_text
from sglang.srt.constrained.xgrammar_backend import XGrammarBackend
from sglang.srt.sampling.sampling_params import SamplingParams, SamplingParamsError

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
FORMAT = {"type": "tag", "begin": "<n>", "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": "</n>"}
LEGACY = {"type": "structural_tag", "structures": [{"begin": "<n>", "schema": SCHEMA, "end": "</n>"}],
          "triggers": ["<n>"]}


def test_forms():
    tag = {"type": "structural_tag", "format": FORMAT}
    assert json.loads(structural_tag_text(tag, "x")) == tag
    assert json.loads(structural_tag_text(json.dumps(tag), "x")) == tag
    legacy = json.loads(structural_tag_text(LEGACY, "x"))["format"]
    assert legacy == {"type": "triggered_tags", "triggers": ["<n>"], "tags": [FORMAT]}
    assert constraint_params({"response_format": LEGACY}) == {"structural_tag": structural_tag_text(LEGACY, "x")}
    sp = SamplingParams(structural_tag=tag)
    sp.verify()
    assert sp.grammar_key() == ("structural_tag", structural_tag_text(tag, "x"))


@pytest.mark.parametrize("value, message", [
    ({"type": "structural_tag"}, 'needs "format", or "structures" and "triggers"'),
    ("{nope", "is not valid JSON"),
    ({"structures": [{"begin": "<n>"}], "triggers": ["<"]}, r'structures\[0\] needs string "begin" and "end"'),
    ([1], "must be a structural tag object"),
])
def test_malformed_refused(value, message):
    with pytest.raises(ConstraintError, match=message):
        structural_tag_text(value, "response_format")
    with pytest.raises(SamplingParamsError, match="structural_tag"):
        SamplingParams(structural_tag=value).verify()


def test_both_forms_compile_and_accept_their_text(tiny_model_dir):
    backend = XGrammarBackend(str(tiny_model_dir("qwen3-vl-tiny")), 151936)
    exact = backend.compile(("structural_tag", structural_tag_text({"type": "structural_tag", "format": FORMAT}, "x")))
    assert backend.matcher(exact).accept_string('<n>{"n": 3}</n>')
    assert not backend.matcher(exact).accept_string("free text")  # the tag alone, nothing before it
    triggered = backend.matcher(backend.compile(("structural_tag", structural_tag_text(LEGACY, "x"))))
    assert triggered.accept_string('free text <n>{"n": 3}</n> more')
    assert not backend.matcher(backend.compile(("structural_tag", structural_tag_text(LEGACY, "x")))) \
        .accept_string('<n>{"m": 3}')
