"""SGLANG_GDN_BACKEND on the Qwen3.5 model (qwen3.5-tiny, float32): read once when the model is built; with
`triton` (sgl_kernel.gdn's kernels, interpreted on CPU) the model's logits, and every state-pool row and
snapshot slot, equal the per-request torch path's over a batch of two requests with snapshot captures, a
chunked continuation and decode steps; the kernels really ran (calls counted) and the torch path calls none.
And (slow) the scheduler on the same model: the same greedy tokens with either backend, through chunked
prefill, the prefix cache's snapshots (a prompt sent again resumes from one) and decode."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

from qwen3_5_driver import Qwen3_5Driver, text_ids
from sglang.srt.mem_cache.state_pool import GDNStatePool
from sglang.srt.model_loader.loader import get_model

PRESET = "qwen3.5-tiny"
GDN_MODULES = ("sgl_kernel.gdn._conv_triton", "sgl_kernel.gdn._chunk_triton", "sgl_kernel.gdn._recurrent_triton")
ENTRIES = ("causal_conv1d_fwd", "causal_conv1d_update", "chunk_gated_delta_rule_fwd",
           "recurrent_gated_delta_rule_update")


class PooledDriver(Qwen3_5Driver):
    """The standalone driver with its states in a GDNStatePool, handed over as the model runner does
    (`states_for` on the batch's request rows, snapshot captures as slots and as the slots' states)."""

    def __init__(self, model, rows: int = 2, snapshots: int = 4):
        super().__init__(model)
        self.pool = GDNStatePool(model.gdn_state_shape(), rows, "cpu", snapshots)
        self.captures: dict[str, list[tuple[int, int]]] = {}  # rid -> (tokens into its next extend, slot)

    def _run(self, fb, states):
        extend = fb.forward_mode.is_extend()
        fb.gdn_states = self.pool.states_for(fb.req_pool_indices_cpu, fb.extend_prefix_lens_cpu if extend else None)
        if extend and self.captures:
            fb.gdn_captures = [self.captures.pop(rid, []) for rid in fb.rids]
            fb.gdn_capture_states = [[(k, self.pool.state(s)) for k, s in caps] for caps in fb.gdn_captures]
        with torch.no_grad():
            return self.model(fb.input_ids, fb.positions, fb)


def _counting(monkeypatch) -> dict[str, int]:
    import sgl_kernel.gdn as gdn

    calls = dict.fromkeys(ENTRIES, 0)
    for name in ENTRIES:
        def wrap(*a, _f=getattr(gdn, name), _n=name, **kw):
            calls[_n] += 1
            return _f(*a, **kw)
        monkeypatch.setattr(gdn, name, wrap)
    return calls


@contextlib.contextmanager
def _interpreted():
    from sgl_kernel.testing import interpreted

    with contextlib.ExitStack() as stack:
        for name in GDN_MODULES:
            stack.enter_context(interpreted(name))
        yield


def _model(path, monkeypatch, backend: str):
    monkeypatch.setenv("SGLANG_GDN_BACKEND", backend)
    model = get_model(path, dtype="float32")
    monkeypatch.delenv("SGLANG_GDN_BACKEND")  # read at build: the forward no longer looks
    return model


def _scenario(model) -> tuple[list[torch.Tensor], GDNStatePool]:
    """a: 60 tokens in chunks of 36 and 24 (snapshots at 16 and 32 inside the first, at the end of the
    second); b: 12 tokens beside a's first chunk (a snapshot at 12, its end); then two decode steps of both."""
    d = PooledDriver(model)
    d.add("a", text_ids(60, 0))
    d.add("b", text_ids(12, 1))
    d.captures = {"a": [(16, 2), (32, 3)], "b": [(12, 4)]}
    logits = [d.extend({"a": 36, "b": 12}).full_logits]
    d.captures = {"a": [(24, 5)]}
    logits.append(d.extend({"a": 24}).full_logits)
    tokens = {rid: int(logits[0][-1 if rid == "b" else 35].argmax()) for rid in ("a", "b")}
    for _ in range(2):
        step = d.decode(tokens)
        logits.append(step)
        tokens = {"a": int(step[0].argmax()), "b": int(step[1].argmax())}
    return logits, d.pool


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir(PRESET))


def test_the_switch_is_read_when_the_model_is_built(path, monkeypatch):
    assert _model(path, monkeypatch, "triton").model.gdn_backend == "triton"
    monkeypatch.setenv("SGLANG_GDN_BACKEND", "cuda")
    with pytest.raises(ValueError, match="SGLANG_GDN_BACKEND"):
        get_model(path, dtype="float32")


def test_triton_refuses_states_outside_a_pool(path, monkeypatch):
    driver = Qwen3_5Driver(_model(path, monkeypatch, "triton"))  # standalone GDNRequestStates
    driver.add("r", text_ids(5, 0))
    with pytest.raises(RuntimeError, match="need forward_batch.gdn_states from a GDNStatePool"):
        driver.prefill("r")


def test_triton_kernels_equal_the_torch_path(path, monkeypatch):
    pytest.importorskip("triton")
    calls = _counting(monkeypatch)
    want, want_pool = _scenario(_model(path, monkeypatch, "torch"))
    assert not any(calls.values()), calls  # the torch path calls no kernel entry
    with _interpreted():
        got, pool = _scenario(_model(path, monkeypatch, "triton"))
    # 3 linear-attention layers: the first extend cuts a at 16 and 32 (3 rounds), the second is one round;
    # decode steps take the decode kernels
    assert calls == {"chunk_gated_delta_rule_fwd": 3 * 4, "causal_conv1d_fwd": 3 * 4,
                     "causal_conv1d_update": 3 * 2, "recurrent_gated_delta_rule_update": 3 * 2}
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool.recurrent, want_pool.recurrent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pool.conv, want_pool.conv, rtol=1e-5, atol=1e-5)
    assert pool.recurrent[2:6].abs().amax(dim=(1, 2, 3, 4)).min() > 0  # every snapshot written


def _served(path, monkeypatch, backend: str) -> list[list[int]]:
    """Greedy tokens of a text prompt crossing the DeltaNet's 64-token chunk, an image prompt and a short
    one, prefilled in chunks of 48 tokens; then the first prompt again (a prefix-cache hit that resumes from
    a captured snapshot) beside a new one."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "managers"))
    from qwen3_5_driver import PLACEHOLDER, noise_image, tiny_processor
    from scheduler_utils import InProcessScheduler

    monkeypatch.setenv("SGLANG_GDN_BACKEND", backend)
    s = InProcessScheduler(path, chunked_prefill_size=48)
    proc = tiny_processor()
    first = [(text_ids(90, 0), None), proc.process(text_ids(5, 1) + PLACEHOLDER + text_ids(7, 2), [noise_image(1)]),
             (text_ids(12, 5), None)]
    rids = [s.submit(ids, mm, max_new_tokens=4, ignore_eos=True) for ids, mm in first]
    s.run_until_idle()
    again = [s.submit(ids, None, max_new_tokens=4, ignore_eos=True) for ids in (text_ids(90, 0), text_ids(70, 6))]
    s.run_until_idle()
    assert s.meta[again[0]]["cached_tokens"] == 89  # the snapshot a token before the prompt's end
    s.assert_no_leak()
    return [s.outputs[r] for r in rids + again]


@pytest.mark.slow  # the scheduler with interpreted kernels: about a minute on 2 cores
def test_scheduler_greedy_tokens_equal_across_backends(path, monkeypatch):
    pytest.importorskip("triton")
    calls = _counting(monkeypatch)
    want = _served(path, monkeypatch, "torch")
    with _interpreted():
        got = _served(path, monkeypatch, "triton")
    assert calls["chunk_gated_delta_rule_fwd"] and calls["recurrent_gated_delta_rule_update"]
    assert got == want
