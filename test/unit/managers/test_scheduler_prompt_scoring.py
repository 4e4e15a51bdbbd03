"""max_new_tokens = 0 in the scheduler: the request is prefilled (in chunks too, next to generating
requests), finishes with "length" and no output token, carries the same prompt logprobs as a
one-token request of the same prompt, and leaves no KV slot or request slot behind."""

from __future__ import annotations

import pytest
import torch

from scheduler_utils import InProcessScheduler


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _text(n, seed):
    return torch.randint(0, 1500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("kw", [dict(), dict(chunked_prefill_size=7)], ids=["one_chunk", "chunk7"])
def test_zero_new_tokens_scores_the_prompt_and_frees_everything(model_path, kw):
    s = InProcessScheduler(model_path, **kw)
    prompt = _text(19, 1)
    other = s.submit(_text(12, 2), max_new_tokens=5, ignore_eos=True)
    scored = s.submit(prompt, max_new_tokens=0, return_logprob=True, logprob_start_len=0, top_logprobs_num=2)
    s.run_until_idle()
    assert s.outputs[scored] == [] and s.finished[scored].type == "length"
    assert s.meta[scored]["completion_tokens"] == 0 and "output_token_logprobs_delta" not in s.meta[scored]
    lps = s.meta[scored]["input_token_logprobs"]
    assert [t for _, t in lps] == prompt and lps[0][0] is None and all(lp < 0 for lp, _ in lps[1:])
    assert len(s.meta[scored]["input_top_logprobs"]) == len(prompt)
    assert len(s.outputs[other]) == 5  # the generating request is unaffected
    s.assert_no_leak()

    one = s.submit(prompt, max_new_tokens=1, return_logprob=True, logprob_start_len=0)
    s.run_until_idle()
    assert len(s.outputs[one]) == 1
    ref = s.meta[one]["input_token_logprobs"]
    assert [t for _, t in ref] == prompt
    assert torch.allclose(torch.tensor([lp for lp, _ in lps[1:]]), torch.tensor([lp for lp, _ in ref[1:]]), atol=1e-5)
    s.assert_no_leak()
