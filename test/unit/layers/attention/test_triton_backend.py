"""The Triton backend's host-free slot list, and backend selection (the kernels themselves are tested
in sgl-kernel/tests; the backend end to end in test/e2e/test_triton_backend.py)."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings, strategies as st

from sglang.srt.layers.attention.triton_backend import kv_indices_from_table
from sglang.srt.server_args import ServerArgs


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(0, 2**16))
def test_kv_indices_concatenate_each_requests_row_prefix(seq_lens, seed):
    rng = random.Random(seed)
    rows, width = 8, 12
    table = torch.tensor([[rng.randrange(1000) for _ in range(width)] for _ in range(rows)])
    pool_idx = rng.sample(range(rows), len(seq_lens))
    indptr = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()])
    got = kv_indices_from_table(table, torch.tensor(pool_idx), indptr, sum(seq_lens))
    want = torch.cat([table[r, :n] for r, n in zip(pool_idx, seq_lens)])
    assert torch.equal(got, want)


def test_auto_backends_are_pure_torch_on_cpu_and_explicit_choices_stand():
    assert ServerArgs(device="cpu").resolved_attention_backends() == ("torch_native", "sdpa")
    args = ServerArgs(device="cpu", attention_backend="triton", mm_attention_backend="triton")
    assert args.resolved_attention_backends() == ("triton", "triton")
