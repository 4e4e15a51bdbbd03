"""The decoding side, for each grammar backend: a request's matcher follows its output (accept, terminate, rollback and replay
after a retraction), and the bitmask masks exactly the disallowed tokens of constrained rows."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.constrained.matcher import (
    RequestGrammar,
    apply_bitmask_sparse_cpu,
    apply_bitmask_torch,
    apply_grammar_bitmask,
    revive_dead_rows,
)
from sglang.srt.constrained.backends import make_grammar_backend

VOCAB = 151936


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def backend(request, tiny_model_dir):
    """Every test runs against both --grammar-backend choices: the matchers must behave alike."""
    if request.param == "llguidance":
        pytest.importorskip("llguidance")  # declared, so installed on CPU; the GPU image may lack its wheel
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    assert json.load(open(f"{path}/config.json"))["text_config"]["vocab_size"] == VOCAB
    return make_grammar_backend(request.param, path, VOCAB, stop_token_ids=[151645])


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir("qwen3-vl-tiny")))


def _grammar(backend, key):
    return RequestGrammar(backend.matcher(backend.compile(key)), key)


def _allowed(backend, g: RequestGrammar) -> set[int]:
    logits = torch.zeros(1, VOCAB)
    apply_grammar_bitmask(logits, [g], [list(g.accepted)], VOCAB)
    return set(torch.isfinite(logits[0]).nonzero().view(-1).tolist())


def test_bitmask_masks_constrained_rows_only(backend, tok):
    g = _grammar(backend, ("regex", "(yes|no)"))
    logits = torch.randn(3, VOCAB + 64)  # padded width, as some checkpoints' heads are
    before = logits.clone()
    rows = apply_grammar_bitmask(logits, [None, g, None], [[], [], []], VOCAB)
    assert rows == [1]
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    allowed = torch.isfinite(logits[1]).nonzero().view(-1).tolist()
    assert allowed and all(t < VOCAB for t in allowed)
    texts = {tok.decode([t]) for t in allowed}
    assert all("yes".startswith(t) or "no".startswith(t) for t in texts), texts
    assert torch.equal(logits[1, allowed], before[1, allowed])  # allowed logits unchanged
    assert apply_grammar_bitmask(logits, [None, None], [[], []], VOCAB) == []  # nothing to do


def test_matcher_follows_the_output_to_termination(backend, tok):
    g = _grammar(backend, ("regex", "ab"))
    ids = tok.encode("ab", add_special_tokens=False)
    for t in ids:
        assert g.accept(t)
    assert not g.is_terminated()
    assert _allowed(backend, g) == {151645}  # complete: only the stop token
    bad = tok.encode("z", add_special_tokens=False)[0]
    assert not g.accept(bad) and g.accepted == ids  # refused tokens change nothing
    assert g.accept(151645) and g.is_terminated()


def test_sync_after_retraction_rolls_back_or_replays(backend, tok):
    key = ("json_schema", json.dumps({"type": "object", "properties": {"k": {"enum": ["red", "green"]}},
                                      "required": ["k"]}))
    ids = tok.encode('{"k": "gr', add_special_tokens=False)
    g = _grammar(backend, key)
    for t in ids:
        assert g.accept(t)
    expected = _allowed(backend, g)
    fresh = _grammar(backend, key)
    fresh.sync(ids)  # a rebuilt matcher (e.g. a new rank-local object) replays the output
    assert fresh.accepted == ids and _allowed(backend, fresh) == expected
    g.sync(ids[:-2])  # output shortened: rolled back to the same state a fresh replay reaches
    short = _grammar(backend, key)
    short.sync(ids[:-2])
    assert g.accepted == ids[:-2] and _allowed(backend, g) == _allowed(backend, short)
    g.sync(ids)  # and forward again
    assert _allowed(backend, g) == expected
    other = tok.encode('{"k": "re', add_special_tokens=False)
    g.sync(other)  # a different history: replayed from the start
    assert g.accepted == other and _allowed(backend, g) != expected


def test_a_grammar_overrides_a_ban_that_would_leave_no_token(backend, tok):
    g = _grammar(backend, ("regex", "a"))
    for t in tok.encode("a", add_special_tokens=False):
        g.accept(t)
    logits = torch.randn(2, VOCAB)
    apply_grammar_bitmask(logits, [None, g], [[], list(g.accepted)], VOCAB)
    masked = logits.clone()
    banned = logits.clone()
    banned[1, 151645] = float("-inf")  # min_new_tokens bans EOS: nothing left
    out = revive_dead_rows(banned, masked, [1])
    assert torch.isfinite(out[1]).nonzero().view(-1).tolist() == [151645]
    assert torch.equal(out[0], banned[0])
    untouched = logits.clone()
    assert revive_dead_rows(untouched, masked, [1]) is untouched


def test_the_device_path_masks_as_xgrammar_does(backend):
    """The torch unpack used for non-CPU logits, run on CPU, against xgrammar's CPU op."""
    import xgrammar as xg

    g1, g2 = _grammar(backend, ("regex", "[0-9]+")), _grammar(backend, ("ebnf", 'root ::= "x" | "yz"'))
    bitmask = xg.allocate_token_bitmask(3, VOCAB)
    g1.fill(bitmask, 0)
    g2.fill(bitmask, 2)
    logits = torch.randn(3, VOCAB)
    ref = logits.clone()
    xg.apply_token_bitmask_inplace(ref, bitmask, vocab_size=VOCAB, indices=[0, 2])
    apply_bitmask_torch(logits, bitmask[[0, 2]], [0, 2], VOCAB)
    assert torch.equal(logits, ref)
    assert 0 < torch.isfinite(logits[0]).sum() < VOCAB and torch.isfinite(logits[1]).all()


def test_the_cuda_path_masks_as_xgrammar_does(backend):
    """The Triton kernel that CUDA logits take (run here on CPU under the Triton interpreter), with the
    rows padded as the CUDA path pads them, against xgrammar's CPU op."""
    pytest.importorskip("triton")
    import xgrammar as xg

    from sglang.srt.constrained.matcher import apply_bitmask_cuda
    from sgl_kernel.testing import interpreted

    g1, g2 = _grammar(backend, ("regex", "[0-9]+")), _grammar(backend, ("ebnf", 'root ::= "x" | "yz"'))
    bitmask = xg.allocate_token_bitmask(3, VOCAB)
    g1.fill(bitmask, 2)
    g2.fill(bitmask, 0)
    logits = torch.randn(3, VOCAB)
    ref = logits.clone()
    xg.apply_token_bitmask_inplace(ref, bitmask, vocab_size=VOCAB, indices=[2, 0])
    with interpreted("sgl_kernel.sampling._bitmask_triton"):
        apply_bitmask_cuda(logits, bitmask, [2, 0], VOCAB)
    assert torch.equal(logits, ref)
    assert 0 < torch.isfinite(logits[2]).sum() < VOCAB and torch.isfinite(logits[1]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_logits_are_masked_as_cpu_logits(backend, tok):
    """apply_grammar_bitmask on CUDA logits (the Triton kernel) and on CPU logits (the sparse op)."""
    keys = [("regex", "[0-9]+"), ("json_schema", '{"type": "object"}')]
    cpu = torch.randn(4, VOCAB)
    cuda = cpu.cuda()
    for logits in (cpu, cuda):
        grammars = [_grammar(backend, keys[0]), None, None, _grammar(backend, keys[1])]
        assert apply_grammar_bitmask(logits, grammars, [[], [], [], []], VOCAB) == [0, 3]
    assert torch.equal(cuda.cpu(), cpu)


def _word_rows(draw_kinds, words: int, gen: torch.Generator) -> torch.Tensor:
    """Bitmask rows of int32 words, each row from a kind: all allowed, all banned, random bits, mostly
    allowed with banned and mixed words (a JSON string), mostly banned with a few allowed ones."""
    rows = []
    for kind in draw_kinds:
        rand = torch.randint(-2**31, 2**31 - 1, (words,), generator=gen, dtype=torch.int64).to(torch.int32)
        pick = torch.rand(words, generator=gen)
        if kind == "all":
            row = torch.full((words,), -1, dtype=torch.int32)
        elif kind == "none":
            row = torch.zeros(words, dtype=torch.int32)
        elif kind == "random":
            row = rand
        elif kind == "permissive":
            row = torch.where(pick < 0.9, -1, torch.where(pick < 0.95, 0, rand)).to(torch.int32)
        else:  # restrictive
            row = torch.where(pick < 0.9, 0, torch.where(pick < 0.95, -1, rand)).to(torch.int32)
        rows.append(row)
    return torch.stack(rows)


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(st.sampled_from(["all", "none", "random", "permissive", "restrictive"]), min_size=1, max_size=6),
       width=st.integers(1, 200), extra=st.integers(0, 40), seed=st.integers(0, 2**16), pick=st.integers(0, 63))
def test_the_sparse_cpu_path_masks_as_xgrammar_does(kinds, width, extra, seed, pick):
    """Any mix of row kinds, any width (a partial last word included), logits wider than the vocabulary,
    any subset of rows: bitwise the logits of the unpacked bitmask, and of xgrammar's CPU op over the
    vocabulary (where that op stays inside each row); columns past the vocabulary are never touched."""
    import xgrammar as xg

    gen = torch.Generator().manual_seed(seed)
    bitmask = _word_rows(kinds, (width + 31) // 32, gen)
    rows = [i for i in range(len(kinds)) if (pick >> (i % 6)) & 1] or [0]
    logits = torch.randn(len(kinds), width + extra, generator=gen)
    original = logits.clone()
    apply_bitmask_sparse_cpu(logits, bitmask, rows, width)
    # the oracle: bit j of word i allows token 32 i + j; banned tokens of the listed rows are -inf
    allowed = ((bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).view(len(kinds), -1)[:, :width]
    expected = original.clone()
    for r in rows:
        expected[r, :width] = original[r, :width].masked_fill(allowed[r] == 0, float("-inf"))
    assert torch.equal(logits, expected)
    if width + extra >= 32 * bitmask.shape[1]:  # narrower rows: xgrammar's op writes past a row's end
        ref = original.clone()
        xg.apply_token_bitmask_inplace(ref, bitmask, vocab_size=width, indices=rows)
        assert torch.equal(logits[:, :width], ref[:, :width])


def test_several_rows_fill_as_each_alone(backend, tok):
    """Rows filled together (xgrammar's thread pool) get the masks each gets alone."""
    keys = [("regex", "[0-9]+"), ("ebnf", 'root ::= "x" | "yz"'), ("json_schema", '{"type": "integer"}')]
    grammars = [_grammar(backend, k) for k in keys]
    grammars[0].accept(tok.encode("7", add_special_tokens=False)[0])
    together = torch.zeros(4, VOCAB)
    rows = apply_grammar_bitmask(together, [grammars[0], None, grammars[1], grammars[2]],
                                 [list(grammars[0].accepted), [], [], []], VOCAB)
    assert rows == [0, 2, 3] and torch.isfinite(together[1]).all()
    for row, g in zip(rows, grammars):
        alone = torch.zeros(1, VOCAB)
        apply_grammar_bitmask(alone, [g], [list(g.accepted)], VOCAB)
        assert torch.equal(together[row], alone[0])
