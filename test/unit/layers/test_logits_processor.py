"""Prompt logprobs in the logits processor: chunked scoring equals one log-softmax over all rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang.srt.layers import logits_processor
from sglang.srt.layers.logits_processor import LogitsProcessor


@pytest.mark.parametrize("chunk, top_n", [(3, 0), (3, 4), (1000, 2)])
def test_scored_rows_equal_a_single_log_softmax_whatever_the_chunking(monkeypatch, chunk, top_n):
    monkeypatch.setattr(logits_processor, "INPUT_LOGPROB_CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    vocab, hidden_size, tokens = 50, 16, 11
    hidden = torch.randn(tokens, hidden_size, generator=g)
    weight = torch.randn(vocab + 6, hidden_size, generator=g)  # padded vocabulary rows are cut off
    rows = torch.tensor([0, 2, 3, 4, 7, 8, 9, 10])
    targets = torch.randint(0, vocab, (rows.numel(),), generator=g)
    fb = SimpleNamespace(last_indices=torch.tensor([10]), return_all_logits=False, input_logprob_rows=rows,
                         input_logprob_targets=targets, input_top_logprobs_num=top_n)
    out = LogitsProcessor(vocab)(hidden, weight, fb)
    ref = torch.log_softmax(hidden[rows] @ weight[:vocab].t(), dim=-1)
    chosen, top = out.input_logprobs
    torch.testing.assert_close(chosen, ref.gather(1, targets[:, None]).squeeze(1))
    if top_n:
        v, i = ref.topk(top_n, dim=-1)
        torch.testing.assert_close(top[0], v)
        assert torch.equal(top[1], i)
    else:
        assert top is None
    torch.testing.assert_close(out.next_token_logits, hidden[[10]] @ weight[:vocab].t())


def test_no_scored_rows_no_prompt_logprobs():
    fb = SimpleNamespace(last_indices=torch.tensor([1]), return_all_logits=False, input_logprob_rows=None)
    out = LogitsProcessor(4)(torch.randn(2, 3), torch.randn(4, 3), fb)
    assert out.input_logprobs is None and out.next_token_logits.shape == (1, 4)
