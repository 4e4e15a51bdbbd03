"""Structural tags through the tool/reasoning server on the random-weight tiny model (whose free output
never contains the tags): response_format structural_tag and sampling_params.structural_tag on
/generate give outputs made of the tags with JSON that validates; /generate's require_reasoning starts its constraint after </think>."""

from __future__ import annotations

import json
import re

import openai
import pytest
import requests

# a test dependency (pyproject's test extra); the GPU image lacks it and its suite collects this module
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["n"], "additionalProperties": False}
TAG = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
    {"type": "const_string", "value": "Answer: "},
    {"type": "tag", "begin": "<n>", "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": "</n>"}]}}
THINK_END = 151668


@pytest.fixture(scope="module")
def oai(tools_server):
    return openai.OpenAI(base_url=tools_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def check(text: str, prefix: str = "") -> None:
    m = re.fullmatch(re.escape(prefix) + r"<n>(.*)</n>", text, re.S)
    assert m, text
    jsonschema.validate(json.loads(m.group(1)), SCHEMA)


def test_response_format_structural_tag(oai):
    for temperature, seed in ((0, None), (1.0, 4)):
        resp = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": "n?"}],
                                           response_format=TAG, temperature=temperature, seed=seed, max_tokens=60)
        assert resp.choices[0].finish_reason == "stop"
        check(resp.choices[0].message.content, "Answer: ")


def test_generate_structural_tag_and_require_reasoning(tools_server):
    url = tools_server.url + "/generate"
    out = requests.post(url, json={"text": "n?", "sampling_params": {"max_new_tokens": 60, "temperature": 0,
                                                                     "structural_tag": TAG}}, timeout=120).json()
    check(out["text"], "Answer: ")
    params = {"max_new_tokens": 30, "temperature": 0, "regex": "[0-9]{2}", "logit_bias": {str(THINK_END): 100}}
    free = requests.post(url, json={"text": "n?", "sampling_params": params}, timeout=120).json()
    assert re.fullmatch("[0-9]{2}", free["text"])  # constrained from the first token: </think> never allowed
    thought = requests.post(url, json={"text": "n?", "sampling_params": params, "require_reasoning": True},
                            timeout=120).json()
    assert re.fullmatch("</think>[0-9]{2}", thought["text"]), thought["text"]  # free until </think>, then digits
