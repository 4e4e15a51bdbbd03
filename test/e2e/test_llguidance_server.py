"""--grammar-backend llguidance through the launched server and the openai client: JSON schema, regex and
EBNF outputs follow their grammars on the random-weight tiny model (whose free output is noise), and an
invalid grammar is a 400 naming the problem while the server keeps serving."""

from __future__ import annotations

import re

import pytest

from test_structured_output import EBNF, MSGS, REGEX, SCHEMA, check_schema, loads

pytest.importorskip("llguidance")  # declared, so installed on CPU; the GPU image may lack its wheel


@pytest.fixture(scope="module")
def lg_server(launch_server):
    return launch_server("--grammar-backend", "llguidance", "--constrained-json-max-whitespace-cnt", "2")


@pytest.fixture(scope="module")
def oai(lg_server):
    import openai

    return openai.OpenAI(base_url=lg_server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_follows_the_schema(oai, temperature):
    r = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=200, temperature=temperature, seed=3,
                                    response_format={"type": "json_schema",
                                                     "json_schema": {"name": "w", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    check_schema(loads(r.choices[0].message.content))


def test_regex_and_ebnf_outputs_match(oai):
    r = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=50, temperature=1.0, seed=5,
                                    extra_body={"regex": REGEX})
    assert re.fullmatch(REGEX, r.choices[0].message.content), r.choices[0].message.content
    r = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=50, temperature=1.0, seed=6,
                                    extra_body={"ebnf": EBNF})
    assert re.fullmatch(r"answer: (yes|no|maybe)\.", r.choices[0].message.content), r.choices[0].message.content


def test_an_invalid_regex_is_a_400_and_the_server_keeps_serving(oai):
    import openai

    with pytest.raises(openai.BadRequestError, match="regex"):
        oai.chat.completions.create(model="m", messages=MSGS, max_tokens=5, extra_body={"regex": "(unclosed"})
    r = oai.chat.completions.create(model="m", messages=MSGS, max_tokens=3)
    assert r.choices[0].message.content is not None


def test_llguidance_is_what_compiled_the_grammars(oai, lg_server):
    """The grammars were compiled by llguidance, read from the scheduler's own counter (a server asked for
    llguidance that fell back to xgrammar passed every output check above on a018ab2)."""
    import requests

    oai.chat.completions.create(model="m", messages=MSGS, max_tokens=8, extra_body={"regex": "[a-c]{3}"})
    compiles = requests.get(lg_server.url + "/get_server_info", timeout=60).json()["paths"]["grammar_compiles"]
    assert set(compiles) == {"llguidance"} and compiles["llguidance"] >= 1, compiles
