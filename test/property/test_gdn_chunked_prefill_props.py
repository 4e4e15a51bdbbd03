"""Property: a Gated DeltaNet prefill cut at any points (chunked prefill, with the DeltaNet's own 64-token
chunks falling anywhere) gives the one-shot outputs and final state, and a snapshot captured at any
position equals the state of a one-shot prefill of exactly that many tokens (what the prefix cache
resumes from)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.configs.qwen3_5_config import HybridAttentionConfig
from sglang.srt.layers.attention.fla.gated_delta_net import GatedDeltaNet

HIDDEN = 16
CFG = HybridAttentionConfig(layer_types=("linear_attention",), linear_num_key_heads=2, linear_num_value_heads=4,
                            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, rotary_dim=8)
TOL = dict(rtol=1e-4, atol=1e-5)


def _layer() -> GatedDeltaNet:
    torch.manual_seed(0)
    layer = GatedDeltaNet(HIDDEN, CFG, 1e-6, chunk_size=16)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
        layer.dt_bias.normal_(-3.0, 1.0)  # slow decays: the state carries far, so a wrong carry shows
        layer.norm.weight.normal_(1.0, 0.1)
    return layer


LAYER = _layer()
SHAPE = LAYER.state_shape(1, torch.float32)


def _fresh():
    return SHAPE.new_request().layer(0)


def _cuts(n: int):
    return st.lists(st.integers(1, n - 1), max_size=5, unique=True).map(sorted)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(2, 70))
def test_any_split_equals_one_shot(data, n):
    cuts = data.draw(_cuts(n))
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(n))
    whole_state, cut_state = _fresh(), _fresh()
    with torch.no_grad():
        whole = LAYER(x, [n], [whole_state])
        pieces, start = [], 0
        for end in cuts + [n]:
            pieces.append(LAYER(x[start:end], [end - start], [cut_state]))
            start = end
    torch.testing.assert_close(torch.cat(pieces), whole, **TOL)
    torch.testing.assert_close(cut_state.recurrent, whole_state.recurrent, **TOL)
    torch.testing.assert_close(cut_state.conv, whole_state.conv, **TOL)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), n=st.integers(2, 70))
def test_a_capture_is_the_state_of_a_prefill_that_long(data, n):
    points = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=4, unique=True).map(sorted))
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(100 + n))
    targets = [_fresh() for _ in points]
    plain = _fresh()
    with torch.no_grad():
        captured = LAYER(x, [n], [_fresh()], [list(zip(points, targets))])
        torch.testing.assert_close(captured, LAYER(x, [n], [plain]), **TOL)  # capturing changes no output
        for k, target in zip(points, targets):
            alone = _fresh()
            LAYER(x[:k], [k], [alone])
            torch.testing.assert_close(target.recurrent, alone.recurrent, **TOL)
            torch.testing.assert_close(target.conv, alone.conv, **TOL)
