"""The pure-torch attention references against an independent dense formulation (SDPA per request on
gathered K/V), plus the wrappers' argument checks. Runs anywhere: no triton needed."""

import os
import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_inputs import (
    GROUPS, HEAD_DIMS, IDX_DTYPES, PAGE_SIZES, SEEDS, decode_case, dense_decode, dense_extend,
    dense_varlen, extend_case, lengths, varlen_case,
)
from sgl_kernel.attention import (
    decode_attention_fwd, decode_attention_torch, extend_attention_fwd, extend_attention_torch,
    varlen_attention_fwd, varlen_attention_torch,
)

TOL = dict(rtol=1e-5, atol=1e-5)
SETTINGS = settings(max_examples=25, deadline=None, database=None)


@SETTINGS
@given(reqs=st.lists(st.tuples(lengths(40), lengths(24)), min_size=1, max_size=4), hk=st.sampled_from([1, 2]),
       group=GROUPS, d=HEAD_DIMS, page=PAGE_SIZES, idx=IDX_DTYPES, seed=SEEDS)
def test_extend_reference_matches_dense(reqs, hk, group, d, page, idx, seed):
    args = extend_case([p for p, _ in reqs], [e for _, e in reqs], hk, group, d, page, idx, seed)
    torch.testing.assert_close(extend_attention_torch(*args), dense_extend(*args), **TOL)


@SETTINGS
@given(kv_lens=st.lists(lengths(70), min_size=1, max_size=4), hk=st.sampled_from([1, 2]), group=GROUPS,
       d=HEAD_DIMS, page=PAGE_SIZES, idx=IDX_DTYPES, seed=SEEDS)
def test_decode_reference_matches_dense(kv_lens, hk, group, d, page, idx, seed):
    args = decode_case(kv_lens, hk, group, d, page, idx, seed)
    torch.testing.assert_close(decode_attention_torch(*args), dense_decode(*args), **TOL)


@SETTINGS
@given(segs=st.lists(lengths(40), min_size=1, max_size=6), heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 2]),
       d=HEAD_DIMS, idx=IDX_DTYPES, seed=SEEDS)
def test_varlen_reference_matches_dense(segs, heads, group, d, idx, seed):
    args = varlen_case(segs, heads, group, d, idx, seed)
    torch.testing.assert_close(varlen_attention_torch(*args), dense_varlen(*args), **TOL)


def test_reference_extend_without_prefix_is_plain_causal():
    q, kb, vb, qo, kv, idx, mq, scale = extend_case([0], [9], 1, 2, 16, 1)
    k, v = kb[idx.long()], vb[idx.long()]
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(2, 1).transpose(0, 1), v.repeat_interleave(2, 1).transpose(0, 1),
        is_causal=True, scale=scale).transpose(0, 1)
    torch.testing.assert_close(extend_attention_torch(q, kb, vb, qo, kv, idx, mq, scale), want, **TOL)


def test_reference_decode_of_empty_request_is_zero_and_out_is_filled():
    q, kb, vb, kv, idx, mk, scale = decode_case([0, 5], 2, 2, 8, 16)
    out = torch.full_like(q, 7.0)
    got = decode_attention_torch(q, kb, vb, kv, idx, mk, scale, out=out)
    assert got is out and bool((out[0] == 0).all())
    torch.testing.assert_close(out, dense_decode(q, kb, vb, kv, idx, mk, scale), **TOL)


def test_reference_rejects_fewer_keys_than_queries():
    q, kb, vb, qo, kv, idx, mq, scale = extend_case([0], [4], 1, 1, 8, 1)
    with pytest.raises(ValueError, match="queries"):
        extend_attention_torch(q, kb, vb, qo, torch.tensor([0, 3], dtype=torch.int32), idx, mq, scale)


@pytest.mark.parametrize("fn", [extend_attention_fwd, extend_attention_torch])
def test_extend_argument_checks(fn):
    q, kb, vb, qo, kv, idx, mq, scale = extend_case([2], [3], 2, 2, 8, 1)
    with pytest.raises(ValueError, match="multiple"):
        fn(q[:, :3], kb, vb, qo, kv, idx, mq, scale)
    with pytest.raises(ValueError, match="int32/int64"):
        fn(q, kb, vb, qo, kv, idx.float(), mq, scale)
    with pytest.raises(ValueError, match="B\\+1"):
        fn(q, kb, vb, qo, kv[:1], idx, mq, scale)
    with pytest.raises(ValueError, match="head dim"):
        fn(q, kb[..., :4], vb[..., :4], qo, kv, idx, mq, scale)
    with pytest.raises(ValueError, match="out"):
        fn(q, kb, vb, qo, kv, idx, mq, scale, out=torch.empty(3, 4, 9))
    with pytest.raises(ValueError, match="dtype"):
        fn(q, kb.double(), vb.double(), qo, kv, idx, mq, scale)


def test_decode_and_varlen_argument_checks():
    q, kb, vb, kv, idx, mk, scale = decode_case([3, 4], 1, 2, 8, 1)
    with pytest.raises(ValueError, match="entries"):
        decode_attention_fwd(q[:1], kb, vb, kv, idx, mk, scale)
    with pytest.raises(ValueError, match="num_kv_splits"):
        decode_attention_fwd(q, kb, vb, kv, idx, mk, scale, num_kv_splits=0)
    qv, k, v, cu, ms, sc = varlen_case([3, 2], 2, 1, 8)
    with pytest.raises(ValueError, match="rows"):
        varlen_attention_fwd(qv, k[:4], v[:4], cu, ms, sc)


def test_kernel_on_cpu_without_interpreter_says_what_to_use(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="decode_attention_torch"):
        decode_attention_fwd(*decode_case([3], 1, 1, 8, 1))
    with pytest.raises(RuntimeError, match="varlen_attention_torch"):
        varlen_attention_fwd(*varlen_case([3], 1, 1, 8))


def test_package_imports_and_references_run_without_triton():
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from sgl_kernel.attention import varlen_attention_torch\n"
        "x = torch.randn(5, 2, 8)\n"
        "out = varlen_attention_torch(x, x, x, torch.tensor([0, 2, 5]), 3, 0.5)\n"
        "assert out.shape == (5, 2, 8)\n"
        "assert not any(m.startswith('triton') and sys.modules[m] is not None for m in sys.modules)\n"
    )
    src = str(pathlib.Path(__file__).resolve().parents[1] / "python")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
