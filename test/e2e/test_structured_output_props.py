"""Property tests of constrained output through the server. The tiny model's weights are random, so every
free choice it makes is arbitrary: only the constraint can make its output valid. Hypothesis generates
bounded JSON schemas (enums, ranged integers, short strings, booleans, short arrays, nested objects) and
regexes (literals, classes, alternations, bounded repeats); every output, at temperature 0 and 1, must
finish with `stop` and validate (jsonschema) or fullmatch. And the server keeps answering /health while
many distinct grammars compile (they compile in worker threads, never on a loop)."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PROPS = settings(max_examples=8, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

_NAMES = st.text("abcdefgh", min_size=1, max_size=6)
_LEAVES = st.one_of(
    st.lists(st.text("abcxyz", min_size=1, max_size=5), min_size=1, max_size=4, unique=True)
    .map(lambda v: {"type": "string", "enum": v}),
    st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(lambda t: {"type": "integer", "minimum": t[0],
                                                                       "maximum": t[0] + t[1]}),
    st.integers(1, 6).map(lambda n: {"type": "string", "minLength": 1, "maxLength": n}),
    st.just({"type": "boolean"}),
)


def _object(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}


def _composite(children):
    return st.one_of(
        st.tuples(children, st.integers(0, 2), st.integers(0, 2))
        .map(lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[1] + t[2]}),
        st.dictionaries(_NAMES, children, min_size=1, max_size=3).map(_object),
    )


SCHEMAS = st.dictionaries(_NAMES, st.recursive(_LEAVES, _composite, max_leaves=5), min_size=1, max_size=3).map(_object)

_ATOMS = st.sampled_from(["a", "b", "xy", "0", "[a-c]", "[0-9]", "[xyz]", "(a|bc)", "-"])
_PIECES = st.tuples(_ATOMS, st.sampled_from(["", "?", "{1,3}", "{2}"])).map("".join)
_SEQUENCES = st.lists(_PIECES, min_size=1, max_size=4).map("".join)
REGEXES = st.lists(_SEQUENCES, min_size=1, max_size=3, unique=True).map(lambda alts: "(" + "|".join(alts) + ")")

# a test dependency (pyproject's test extra); the GPU image lacks it, and its suite collects this module
jsonschema = pytest.importorskip("jsonschema")

SAMPLINGS = [{"temperature": 0}, {"temperature": 1.0, "seed": 7}]


@pytest.fixture(scope="module")
def props_server(tools_server):
    # the session's constrained-output server (JSON whitespace runs capped: the random model would otherwise
    # pad JSON up to the limit); these tests use /v1/completions, which its reasoning parser leaves alone
    return tools_server


def _complete(server, extra: dict, sampling: dict) -> dict:
    body = {"prompt": "Answer:", "max_tokens": 256, **sampling, **extra}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@settings(PROPS, max_examples=6)
@given(schema=SCHEMAS)
def test_every_output_validates_against_its_schema(props_server, schema):
    for sampling in SAMPLINGS:
        choice = _complete(props_server, {"json_schema": json.dumps(schema)}, sampling)
        assert choice["finish_reason"] == "stop", (schema, choice)
        # strict=False: xgrammar lets length-bounded strings hold raw control characters
        jsonschema.validate(json.loads(choice["text"], strict=False), schema)


@PROPS
@given(pattern=REGEXES)
def test_every_output_fullmatches_its_regex(props_server, pattern):
    for sampling in SAMPLINGS:
        choice = _complete(props_server, {"regex": pattern}, sampling)
        assert choice["finish_reason"] == "stop", (pattern, choice)
        assert re.fullmatch(pattern, choice["text"]), (pattern, choice["text"])


def _slow_schema(i: int, n: int = 300) -> str:
    """A schema that takes tens of milliseconds to compile, distinct for every i (no cache hits)."""
    props = {f"k{i}_{j}": {"type": "string", "pattern": f"[a-z]{{1,{j % 7 + 2}}}[0-9]{{2}}(x|y{i})"} for j in range(n)}
    return json.dumps({"type": "object", "properties": props, "required": sorted(props)})


def test_health_answers_while_distinct_schemas_compile(props_server):
    """32 requests with distinct schemas are sent at once; while grammars are still compiling (the
    server's own count, read before and after), /health answers. The latencies are printed: the figure
    is benchmark/performance/bench_grammar_step.py's to report, not this test's to time."""
    url = props_server.url

    def compiling() -> int:
        info = requests.get(url + "/get_server_info", timeout=60).json()
        return info["grammar_cache"]["compiling"]  # the scheduler's: the only place grammars compile

    statuses: list[int] = []

    def send(i: int) -> None:
        r = requests.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1,
                                                          "json_schema": _slow_schema(i)}, timeout=300)
        statuses.append(r.status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    bracketed: list[float] = []  # /health latencies with compiles outstanding before and after
    try:
        while any(t.is_alive() for t in threads):
            before = compiling()
            t0 = time.perf_counter()
            assert requests.get(url + "/health", timeout=60).status_code == 200
            latency = time.perf_counter() - t0
            if before and compiling():
                bracketed.append(latency)
    finally:
        for t in threads:
            t.join()
    assert statuses == [200] * 32
    assert bracketed, "no /health call fell inside the compiles: they finished before the first poll"
    print(f"/health during compiles: {len(bracketed)} calls, max {max(bracketed) * 1e3:.1f} ms")
