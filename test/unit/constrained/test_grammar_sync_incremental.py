"""`RequestGrammar.sync` runs before every fill: over a long output it must not rescan the output or
replay the matcher (quadratic over a long reasoning). A fake matcher counts the tokens it is fed, and the
output counts the elements read from it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sglang.srt.constrained.matcher import RequestGrammar

THINK_END = 7


class CountingMatcher:
    """Accepts every token but `refuse`; counts accept_token calls and keeps the accepted history."""

    def __init__(self, refuse: int = -1):
        self.refuse, self.fed, self.resets, self.history = refuse, 0, 0, []

    def accept_token(self, tok: int) -> bool:
        self.fed += 1
        if tok == self.refuse:
            return False
        self.history.append(tok)
        return True

    def rollback(self, k: int) -> None:
        del self.history[len(self.history) - k:]

    def reset(self) -> None:
        self.resets += 1
        self.history = []

    def is_terminated(self) -> bool:
        return False


class CountingOutput(Sequence):
    """A read-only view of a token list that counts the elements read (a slice counts its length)."""

    def __init__(self, ids: list[int]):
        self.ids, self.reads = ids, 0

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        got = self.ids[i]
        self.reads += len(got) if isinstance(i, slice) else 1
        return got


@pytest.mark.parametrize("start_after", [None, THINK_END])
def test_sync_each_step_reads_a_bounded_number_of_tokens(start_after):
    steps, reasoning = 4000, 3000
    m = CountingMatcher()
    g = RequestGrammar(m, start_after=start_after)
    ids: list[int] = []
    out = CountingOutput(ids)
    for i in range(steps):
        g.sync(out)  # the worker, before filling the row
        tok = THINK_END if i == reasoning else 100 + i % 50
        assert g.accept(tok)  # the scheduler, after sampling
        ids.append(tok)
    g.sync(out)
    assert m.resets == 0
    assert m.fed == (steps if start_after is None else steps - reasoning - 1)  # each token once, no replay
    assert out.reads <= 2 * steps, f"{out.reads} output tokens read over {steps} steps: a rescan per step"
    assert m.history == g.accepted == ids[0 if start_after is None else reasoning + 1:]


@pytest.mark.parametrize("start_after", [None, THINK_END])
def test_sync_after_a_change_takes_only_the_difference(start_after):
    """A longer output: only the new tokens are fed; a shorter one after the start: a rollback; shorter
    than the start token: back to waiting; a different last token: a replay."""
    ids = [1, 2, THINK_END, 3, 4, 5, 6]
    m = CountingMatcher()
    g = RequestGrammar(m, start_after=start_after)
    g.sync(ids[:4])
    fed = m.fed
    g.sync(ids)
    assert m.fed - fed == 3 and m.resets == 0 and g.accepted == m.history
    g.sync(ids[:5])  # rolled back, nothing fed
    assert m.fed - fed == 3 and m.resets == 0
    assert g.accepted == m.history == (ids[:5] if start_after is None else [3, 4])
    if start_after is not None:
        g.sync(ids[:3])  # just the start token: rolled back to the grammar's start
        assert g.accepted == m.history == [] and g.is_active()
        g.sync(ids[:2])  # before the start token: waiting again
        assert not g.is_active() and m.history == []
    g.sync(ids[:4] + [9])  # a different history: replayed
    want = ids[:4] + [9]
    assert g.accepted == m.history == (want if start_after is None else [3, 9])
    assert g.consumed == 5 and g.last == 9


def test_sync_raises_on_a_token_the_grammar_refuses():
    g = RequestGrammar(CountingMatcher(refuse=5))
    g.sync([1, 2])
    with pytest.raises(ValueError, match="token 5 at position 2"):
        g.sync([1, 2, 5])
    assert g.consumed == 2 and g.accepted == [1, 2]  # the refused token changed nothing
