"""Where a grammar is checked: the tokenizer side only does what is cheap (the size limit, the JSON parse,
a backend to compile it) and compiles nothing; the scheduler ranks compile each new grammar once and that
compile is its check: invalid, empty language or past the time limit is a 400 naming the problem, the
verdict kept (by digest) so the same grammar is refused again without compiling."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from sglang.srt.constrained import xgrammar_backend
from sglang.srt.constrained.scheduler_grammar import GrammarQueue
from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.server_args import ServerArgs

ARGS = SimpleNamespace(grammar_backend="xgrammar", constrained_json_disable_any_whitespace=False,
                       constrained_json_max_whitespace_cnt=None)
ONE_RANK = SimpleNamespace(size=1)


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


@pytest.fixture(scope="module")
def real_queue(model_path):
    """A rank's queue over the real xgrammar backend (the tiny model's 151,936-token vocabulary)."""
    q = GrammarQueue(ARGS, model_path, 151936, [151645], ONE_RANK)
    yield q
    q.close()


def _req(rid: str, key):
    return SimpleNamespace(rid=rid, grammar=None, grammar_start_after=None,
                           sampling_params=SimpleNamespace(grammar_key=lambda: key))


def _settle(queue: GrammarQueue, *keys) -> tuple[list, dict]:
    """Adds one request per key, waits for their compiles to end, then pops: (ready rids, rid -> (message,
    status) of the failed)."""
    for i, key in enumerate(keys):
        queue.add(_req(f"r{i}", key), key)
    for _, fut in list(queue.pending):
        fut.exception(60)  # waits for the compile (or its time limit) without raising
    ready, failed = queue.pop_ready()
    assert not queue.pending
    return [r.rid for r in ready], {r.rid: (msg, status) for r, msg, status in failed}


# ----------------------------------------------------------------------------- the tokenizer side
@pytest.fixture
def builder(model_path, monkeypatch):
    from sglang.srt.managers.request_builder import RequestBuilder

    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")
    made = []

    def make(**server):
        b = RequestBuilder(ServerArgs(model_path=model_path, **server), model_path)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def test_the_tokenizer_side_compiles_nothing(builder, monkeypatch):
    """Invalid, empty-language and valid grammars all pass the tokenizer's checks and are built and sent
    with their key: only the ranks compile (a compile here would fail this test)."""
    def no_compile(*a, **k):
        raise AssertionError("the tokenizer side compiled a grammar")

    monkeypatch.setattr(xgrammar_backend.XGrammarBackend, "compile", no_compile)
    monkeypatch.setattr(xgrammar_backend.XGrammarBackend, "prepare", no_compile)
    b = builder()
    for params in ({"regex": "a(b"}, {"json_schema": '{"$ref": "#"}'}, {"ebnf": 'root ::= "x"'}):
        tokenized, _ = b.build(b.check(GenerateReqInput(text="hi", sampling_params=params), "rid-1"))
        (kind, text), = params.items()
        assert tokenized.sampling_params.grammar_key() == (kind, text)


def test_the_cheap_checks_stay_on_the_tokenizer_side(builder, monkeypatch):
    """Size limit, JSON parse, allOf and --grammar-backend none: each a 400 before anything is built."""
    monkeypatch.setenv("SGLANG_GRAMMAR_MAX_BYTES", "1000")
    b = builder()
    cases = [({"regex": "a" * 1001}, "regex is 1001 bytes, more than the 1000-byte limit (SGLANG_GRAMMAR_MAX_BYTES)"),
             ({"json_schema": "{not json"}, "json_schema"),
             ({"json_schema": json.dumps({"allOf": [{"type": "string"}, {"type": "integer"}]})},
              "allOf with 2 schemas (at $) is not supported")]
    for params, phrase in cases:
        with pytest.raises(GenerateError) as e:
            b.check(GenerateReqInput(text="hi", sampling_params=params), "rid-1")
        assert e.value.status_code == 400 and phrase in e.value.message, e.value.message
    none = builder(grammar_backend="none")
    with pytest.raises(GenerateError) as e:
        none.check(GenerateReqInput(text="hi", sampling_params={"ebnf": 'root ::= "a"'}), "rid-1")
    assert e.value.status_code == 400 and "--grammar-backend none" in e.value.message
    none.check(GenerateReqInput(text="hi", sampling_params={"max_new_tokens": 2}), "rid-2")  # no constraint: fine


# ----------------------------------------------------------------------------- the ranks
def test_a_valid_grammar_is_ready_an_invalid_one_a_400_and_the_verdict_is_kept(real_queue):
    misses = real_queue.cache.misses
    ready, failed = _settle(real_queue, ("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}'),
                            ("regex", "[a-"))
    assert ready == ["r0"]
    message, status = failed["r1"]
    assert status == 400 and message.startswith("invalid regex:"), message
    assert real_queue.cache.misses == misses + 2
    _, again = _settle(real_queue, ("regex", "[a-"))
    assert again["r0"] == (message, 400) and real_queue.cache.misses == misses + 2  # refused without compiling


@pytest.mark.parametrize("key, where", [
    (("json_schema", '{"$ref": "#"}'), "it admits no output"),
    (("json_schema", '{"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}'), "it admits no output"),
    (("structural_tag", json.dumps({"type": "structural_tag", "format": {
        "type": "tag", "begin": "<tool_call>\n", "content": {"type": "json_schema", "json_schema": {"$ref": "#"}},
        "end": "</tool_call>"}})), "the JSON schema at $.format.content admits no output"),
])
def test_a_grammar_that_admits_no_output_is_a_400(real_queue, key, where):
    recursive = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    ready, failed = _settle(real_queue, key, ("json_schema", json.dumps(recursive)))
    message, status = failed["r0"]
    assert status == 400 and message.startswith(f"invalid {key[0]}: {where} at all"), message
    assert ready == ["r1"]  # recursion with a way out is fine


def test_the_cache_keeps_digests_not_texts(real_queue):
    big = "(" + "|".join(f"word{i}" for i in range(5000)) + ")"
    ready, _ = _settle(real_queue, ("regex", big))
    assert ready == ["r0"] and ("regex", big) in real_queue.cache
    assert all(isinstance(d, bytes) and len(d) == 32 for _, d in real_queue.cache._entries)


class _SlowBackend:
    """Grammars named "slow..." compile until the gate opens; the others at once."""

    def __init__(self):
        self.gate, self.compiled = threading.Event(), []

    def compile(self, key):
        if key[1].startswith("slow"):
            self.gate.wait(60)
        self.compiled.append(key)
        return key

    def matcher(self, compiled):
        return SimpleNamespace(compiled=compiled)


def test_slow_compiles_are_a_400_at_the_limit_and_do_not_hold_back_the_next_grammar(monkeypatch):
    """Every compile place taken by a grammar that overruns: each is a 400 naming the limit at its limit,
    and a small grammar queued behind them still compiles; the same slow grammar sent again is refused
    from the kept verdict (no second compile)."""
    monkeypatch.setenv("SGLANG_GRAMMAR_COMPILE_TIMEOUT_S", "1")
    slow = _SlowBackend()
    queue = GrammarQueue(ARGS, "unused", 100, [0], ONE_RANK, backend=slow)
    try:
        keys = [("regex", f"slow{i}") for i in range(4)] + [("regex", "[0-9]{4}")]
        ready, failed = _settle(queue, *keys)
        assert ready == ["r4"] and sorted(failed) == ["r0", "r1", "r2", "r3"]
        assert all(v == ("the regex did not compile within 1 s (SGLANG_GRAMMAR_COMPILE_TIMEOUT_S); simplify it", 400)
                   for v in failed.values()), failed
        assert not slow.gate.is_set() and slow.compiled == [("regex", "[0-9]{4}")]
        _, again = _settle(queue, ("regex", "slow0"))
        assert again["r0"][1] == 400 and queue.cache.misses == 5 and queue.cache.stats()["overruns"] == 4
    finally:
        slow.gate.set()
        queue.close()
