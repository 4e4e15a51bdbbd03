"""The Triton token-bitmask kernel against its torch reference and an element-by-element oracle: CPU
float32 under the Triton interpreter (`sgl_kernel.testing.interpreted`), bf16 and the real vocabulary on
CUDA only (marked `gpu`). Masking is exact: the results must be bitwise equal. Skipped without triton."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from sgl_kernel.sampling import apply_token_bitmask, apply_token_bitmask_torch  # noqa: E402
from sgl_kernel.testing import interpreted  # noqa: E402

KERNEL_MODULE = "sgl_kernel.sampling._bitmask_triton"
KINDS = ["all", "none", "random", "permissive", "restrictive"]


def _bitmask(kinds: list[str], words: int, gen: torch.Generator) -> torch.Tensor:
    """int32 rows of one kind each: all allowed, all banned, random bits, mostly allowed words (inside a
    JSON string), mostly banned words (between JSON tokens)."""
    out = []
    for kind in kinds:
        rand = torch.randint(-2**31, 2**31 - 1, (words,), generator=gen, dtype=torch.int64).to(torch.int32)
        pick = torch.rand(words, generator=gen)
        row = {"all": torch.full((words,), -1, dtype=torch.int32), "none": torch.zeros(words, dtype=torch.int32),
               "random": rand,
               "permissive": torch.where(pick < 0.9, -1, torch.where(pick < 0.95, 0, rand)).to(torch.int32),
               "restrictive": torch.where(pick < 0.9, 0, torch.where(pick < 0.95, -1, rand)).to(torch.int32)}[kind]
        out.append(row)
    return torch.stack(out) if out else torch.zeros(0, words, dtype=torch.int32)


def _oracle(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], vocab: int) -> torch.Tensor:
    out = logits.clone()
    for r, row in enumerate(rows):
        for t in range(vocab):
            if not (int(bitmask[r, t // 32]) >> (t % 32)) & 1:
                out[row, t] = float("-inf")
    return out


@settings(max_examples=40, deadline=None, database=None)
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=0, max_size=4), vocab=st.integers(0, 700),
       extra_cols=st.integers(0, 40), extra_words=st.integers(0, 2), extra_rows=st.integers(0, 3),
       seed=st.integers(0, 2**16))
def test_kernel_matches_reference_and_oracle(kinds, vocab, extra_cols, extra_words, extra_rows, seed):
    """Any rows (a subset of a larger batch, in any order), any vocabulary (a partial last word included),
    logits wider than the vocabulary and bitmask rows wider than needed: every banned token -inf, every
    other logit bitwise unchanged (allowed tokens, columns past the vocabulary, rows not listed)."""
    gen = torch.Generator().manual_seed(seed)
    bitmask = _bitmask(kinds, (vocab + 31) // 32 + extra_words, gen)
    batch = len(kinds) + extra_rows
    rows = torch.randperm(batch, generator=gen)[: len(kinds)]
    logits = torch.randn(batch, vocab + extra_cols, generator=gen)
    want = _oracle(logits, bitmask, rows.tolist(), vocab)
    ref = logits.clone()
    apply_token_bitmask_torch(ref, bitmask, rows, vocab)
    assert torch.equal(ref, want)
    with interpreted(KERNEL_MODULE):
        apply_token_bitmask(logits, bitmask, rows.to(torch.int32), vocab)
    assert torch.equal(logits, want)


def test_kernel_on_a_strided_row_view_leaves_the_rest_alone():
    """Logits as a row-strided view (a wider buffer's first columns): nothing past the view is written."""
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(3, 300, generator=gen)
    view = base[:, :200]
    bitmask = _bitmask(["random", "restrictive"], 7, gen)
    rows = torch.tensor([2, 0])
    want = base.clone()
    apply_token_bitmask_torch(want[:, :200], bitmask, rows, 200)
    with interpreted(KERNEL_MODULE):
        apply_token_bitmask(view, bitmask, rows, 200)
    assert torch.equal(base, want)


def test_bad_arguments_are_refused_before_any_launch():
    logits = torch.zeros(2, 64)
    rows = torch.tensor([0])
    with pytest.raises(ValueError, match="bitmask must be int32"):
        apply_token_bitmask_torch(logits, torch.zeros(1, 1, dtype=torch.int32), rows, 64)
    with pytest.raises(ValueError, match="vocab 65"):
        apply_token_bitmask_torch(logits, torch.zeros(1, 3, dtype=torch.int32), rows, 65)
    with pytest.raises(ValueError, match="rows must be"):
        apply_token_bitmask_torch(logits, torch.zeros(1, 2, dtype=torch.int32), rows.float(), 64)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        apply_token_bitmask(logits, torch.zeros(1, 2, dtype=torch.int32), rows, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_kernel_matches_reference_at_the_real_vocabulary(dtype):
    """160 rows of logits, 64 of them masked (every kind of row), vocabulary 151,936, padded head."""
    vocab, width, batch = 151936, 152064, 160
    gen = torch.Generator().manual_seed(0)
    kinds = [KINDS[i % len(KINDS)] for i in range(64)]
    bitmask = _bitmask(kinds, (vocab + 31) // 32, gen)
    rows = torch.randperm(batch, generator=gen)[:64]
    logits = torch.randn(batch, width, generator=gen).to(dtype)
    want = logits.clone()
    apply_token_bitmask_torch(want, bitmask, rows, vocab)
    got = logits.cuda()
    apply_token_bitmask(got, bitmask.cuda(), rows.cuda(), vocab)
    assert torch.equal(got.cpu(), want)
