"""Constrained decoding through the scheduler on the random-weight tiny model (whose free output is
noise, so only the grammar makes it valid): outputs match their grammar and finish with `stop`, rows
without a constraint are untouched, retractions keep the matchers in step, a request waits for its
grammar holding no KV (and can be aborted there), and a grammar that fails to compile is a 400."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

from scheduler_utils import InProcessScheduler

SCHEMA = json.dumps({
    "type": "object",
    "properties": {"color": {"enum": ["red", "green"]}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["color", "n"], "additionalProperties": False,
})

JSON_REGEX = r'\{"color": "(red|green)", "n": [1-9]\}'


def _text(n, seed):
    return torch.randint(0, 1500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


@pytest.fixture(scope="module")
def tok(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _check_json(text):
    obj = json.loads(text)
    assert set(obj) == {"color", "n"} and obj["color"] in ("red", "green") and 1 <= obj["n"] <= 9, obj


def _compiled(s) -> None:
    """Waits for the grammars the scheduler's queue is compiling (the in-process loop has no socket to
    wait on: it would spin through its step budget)."""
    for _, fut in list(s.sched.grammar_queue.pending):
        fut.exception(60)


def _run(path, reqs, first_prompt=0, **kw):
    s = InProcessScheduler(path, **kw)
    rids = [s.submit(_text(30, 50 + first_prompt + i), None, **sp) for i, sp in enumerate(reqs)]
    _compiled(s)
    s.run_until_idle()
    s.assert_no_leak()
    return s, rids


REQS = [
    dict(max_new_tokens=60, json_schema=SCHEMA),
    dict(max_new_tokens=20),  # unconstrained neighbour
    dict(max_new_tokens=30, regex=r"[a-c]{3,6}@(x|yz)", temperature=1.0, seed=7),
    dict(max_new_tokens=40, json_schema=SCHEMA, temperature=1.0, seed=3),
]


def test_outputs_match_their_grammar_and_stop(path, tok):
    s, rids = _run(path, REQS)
    for i in (0, 3):
        _check_json(tok.decode(s.outputs[rids[i]], skip_special_tokens=True))
        assert s.finished[rids[i]].type == "stop"
    assert re.fullmatch(r"[a-c]{3,6}@(x|yz)", tok.decode(s.outputs[rids[2]], skip_special_tokens=True))
    assert s.finished[rids[2]].type == "stop" and s.finished[rids[2]].matched in s.sched.eos_ids
    alone, [rid] = _run(path, [REQS[1]], first_prompt=1)
    assert s.outputs[rids[1]] == alone.outputs[rid]  # the unconstrained row is untouched by its neighbours'
    unconstrained, [free] = _run(path, [dict(max_new_tokens=20)])
    with pytest.raises(ValueError):  # the grammar is what makes the output JSON
        json.loads(tok.decode(unconstrained.outputs[free], skip_special_tokens=True))


def test_retraction_keeps_matchers_in_step(path, tok, monkeypatch):
    from sglang.srt.managers import schedule_policy

    monkeypatch.setattr(schedule_policy, "DECODE_RESERVE_CLIP", 1)  # admit optimistically: retractions
    # JSON by regex: no free whitespace, so the random model completes it within the token budget
    reqs = [dict(max_new_tokens=40, regex=JSON_REGEX, ignore_eos=True, temperature=1.0, seed=i) for i in range(4)]
    tight, rids = _run(path, reqs, max_total_tokens=150, chunked_prefill_size=32)
    assert tight.sched.num_retractions > 0, "the budget should force retractions"
    roomy, rids2 = _run(path, reqs)
    for a, b in zip(rids, rids2):
        assert tight.outputs[a] == roomy.outputs[b]
        _check_json(tok.decode(tight.outputs[a], skip_special_tokens=True))
        assert tight.finished[a].type == "stop"  # the complete grammar ends it, ignore_eos or not


class _GatedBackend:
    """The real backend behind a gate: compiles wait until the test opens it."""

    def __init__(self, real):
        self.real, self.gate = real, threading.Event()

    def compile(self, key):
        self.gate.wait(30)
        return self.real.compile(key)

    def matcher(self, compiled):
        return self.real.matcher(compiled)


def test_a_request_waits_for_its_grammar_without_kv(path, tok):
    s = InProcessScheduler(path)
    queue = s.sched.grammar_queue
    gated = _GatedBackend(queue.backend)
    queue.backend = gated
    queue.cache._compile = gated.compile
    free = s.sched.kv.available_tokens()
    waiting = s.submit(_text(20, 1), None, max_new_tokens=30, regex=JSON_REGEX)
    aborted = s.submit(_text(20, 2), None, max_new_tokens=30, regex="[0-9]+")
    plain = s.submit(_text(20, 3), None, max_new_tokens=5)
    for _ in range(8):  # the unconstrained request runs to completion meanwhile
        s.step()
    assert s.finished[plain].type == "length"
    assert len(queue) == 2 and not s.sched.is_idle() and s.sched.kv.available_tokens() == free
    s.sched.handle_abort(aborted, "client gone")
    s.sched.flush_outputs()
    s._drain()
    assert s.finished[aborted].type == "abort" and len(queue) == 1
    gated.gate.set()
    _compiled(s)
    s.run_until_idle()
    _check_json(tok.decode(s.outputs[waiting], skip_special_tokens=True))
    s.assert_no_leak()


def test_a_grammar_that_does_not_compile_is_a_400(path):
    s = InProcessScheduler(path)
    rid = s.submit(_text(10, 1), None, max_new_tokens=5, regex="a(b")
    _compiled(s)
    s.run_until_idle()
    fr = s.finished[rid]
    assert fr.type == "abort" and fr.status_code == 400 and "parenthesis is not closed" in fr.message
    s.assert_no_leak()


def test_n_copies_get_their_own_matchers(path):
    s = InProcessScheduler(path)
    a = s.submit(_text(10, 1), None, max_new_tokens=30, regex="(ab|cd)+", temperature=1.0, seed=1)
    b = s.submit(_text(10, 1), None, max_new_tokens=30, regex="(ab|cd)+", temperature=1.0, seed=2)
    _compiled(s)
    s.step()
    assert not s.sched.grammar_queue
    reqs = {r.rid: r for r in s.sched.waiting + s.sched.running}
    assert reqs[a].grammar is not reqs[b].grammar and reqs[a].grammar.matcher is not reqs[b].grammar.matcher
    s.run_until_idle()
    assert s.outputs[a] != s.outputs[b]


def test_without_a_grammar_backend_constraints_are_refused(path):
    s = InProcessScheduler(path)
    s.sched.grammar_queue = None  # what --grammar-backend none leaves (the request builder refuses first)
    rid = s.submit(_text(10, 1), None, max_new_tokens=5, ebnf='root ::= "x"')
    s.run_until_idle()
    assert s.finished[rid].status_code == 400 and "--grammar-backend none" in s.finished[rid].message


def test_chunked_prefill_masks_only_the_row_that_samples(path, tok, monkeypatch):
    """Prompt chunks sample a token that is dropped: their rows are not masked (nor their matchers read);
    the output equals the unchunked one."""
    from sglang.srt.constrained import matcher as matcher_mod
    from sglang.srt.managers import tp_worker

    masked_rows = []
    real = matcher_mod.apply_grammar_bitmask

    def spy(logits, grammars, outputs, vocab):
        rows = real(logits, grammars, outputs, vocab)
        masked_rows.append(len(rows))
        return rows

    monkeypatch.setattr(tp_worker, "apply_grammar_bitmask", spy)
    req = dict(max_new_tokens=40, regex=JSON_REGEX, temperature=1.0, seed=4)
    chunked, [a] = _run(path, [req], chunked_prefill_size=8)
    chunk_calls = masked_rows[:4]  # 30 prompt tokens in chunks of 8: three dropped samples, then the last chunk
    assert chunk_calls == [0, 0, 0, 1], masked_rows
    whole, [b] = _run(path, [req])
    assert chunked.outputs[a] == whole.outputs[b]
    _check_json(tok.decode(chunked.outputs[a], skip_special_tokens=True))


TAG_WITHOUT_OUTPUT = {"type": "structural_tag", "format": {
    "type": "tag", "begin": "<call>", "end": "</call>", "content": {"type": "json_schema", "json_schema": {"$ref": "#"}}}}


def test_a_grammar_without_output_is_refused_where_it_compiles(path):
    """A tool's parameters {"$ref": "#"} (no output can match it) behind a tag's opening text: the rank's
    compile is the grammar's check, so the request ends with a 400 naming the schema before it holds KV,
    and a neighbour with a good grammar runs."""
    s = InProcessScheduler(path)
    rid = s.submit(_text(10, 1), None, max_new_tokens=30, structural_tag=json.dumps(TAG_WITHOUT_OUTPUT))
    good = s.submit(_text(10, 2), None, max_new_tokens=30, regex="(ab|cd)+x")
    _compiled(s)
    s.run_until_idle()
    fr = s.finished[rid]
    assert fr.type == "abort" and fr.status_code == 400, fr
    assert fr.message == ("invalid structural_tag: the JSON schema at $.format.content admits no output at all "
                          '(a schema that only refers to itself, such as {"$ref": "#"}, matches nothing)'), fr.message
    assert s.finished[good].type == "stop"
    s.assert_no_leak()


def test_a_grammar_whose_language_runs_out_is_a_400_not_a_500(path):
    """A grammar past the compile-time check (compiled plainly here) whose row after the opening text
    allows no token. The request ends with a 400 naming its grammar, not the 500 of a sampled token that
    'does not fit': the scheduler must not treat a grammar's dead end as a server fault."""
    s = InProcessScheduler(path)
    queue = s.sched.grammar_queue
    queue.cache._compile = queue.backend.compile  # no empty-language check: the dead end is met mid-decode
    # "<call>" then a rule with no base case: an opening any grammar library compiles, and nothing after it
    rid = s.submit(_text(10, 1), None, max_new_tokens=30, ebnf='root ::= "<call>" rest\nrest ::= rest "a"')
    _compiled(s)
    s.run_until_idle()
    fr = s.finished[rid]
    assert fr.type == "abort" and fr.status_code == 400, fr
    assert fr.message.startswith("invalid ebnf: no output can continue it after"), fr.message
    s.assert_no_leak()
