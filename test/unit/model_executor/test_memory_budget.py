"""Start-up memory decisions: the KV budget, and one prefill chunk's activations against what it left."""

from __future__ import annotations

import pytest

from sglang.srt.configs.model_config import TextConfig
from sglang.srt.model_executor.memory_budget import MIN_CHUNK, fit_chunk, kv_budget_tokens, prefill_activation_bytes

GiB = 1 << 30
# Qwen3-VL-4B's text model (MISSION section 6)
Q3_4B = TextConfig(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=5e6,
                   mrope_section=(24, 20, 20), mrope_interleaved=True, max_position_embeddings=262144,
                   attention_bias=False)


def test_activations_grow_with_the_chunk_and_linearly_with_the_context():
    a = prefill_activation_bytes(Q3_4B, 8192, 32768, 2)
    assert prefill_activation_bytes(Q3_4B, 16384, 32768, 2) > a
    # context enters only through the gathered keys: doubling it adds exactly that term, no chunk x context
    grow = prefill_activation_bytes(Q3_4B, 8192, 65536, 2) - a
    assert grow == 32768 * 8 * 128 * 2 * 4
    assert prefill_activation_bytes(Q3_4B, 8192, 32768, 2, tp_size=4) < a


def test_a_small_chunk_needs_little_the_fixed_terms_shrink_with_it():
    """The score tile and the logits rows are bounded by the chunk too: a 16-token chunk of a 4k context
    needs tens of MiB, not the 0.77 GiB of a full tile and 512 logits rows (which once refused start-up
    of --chunked-prefill-size 16 servers on a busy host)."""
    sizes = [16, 64, 256, 1024, 8192]
    needs = [prefill_activation_bytes(Q3_4B, n, 4096, 2) for n in sizes]
    assert needs == sorted(needs) and len(set(needs)) == len(needs)
    assert needs[0] < 0.1 * GiB


def test_a_chunk_that_fits_is_kept_without_a_word():
    assert fit_chunk(8192, lambda n: n * 1000, available=100 * GiB) == (8192, None)


def test_a_chunk_that_does_not_fit_is_halved_until_it_does_with_one_line():
    need = lambda n: n * (1 << 20)  # 1 MiB per token
    size, line = fit_chunk(8192, need, available=3 * GiB)
    assert size == 2048 and need(size) <= 0.9 * 3 * GiB < need(size * 2)
    assert "--chunked-prefill-size 8192" in line and "2048" in line


def test_nothing_fits_is_one_clear_start_up_error():
    with pytest.raises(RuntimeError, match=f"a {MIN_CHUNK}-token prefill chunk needs .* GiB of activations"):
        fit_chunk(8192, lambda n: n * GiB, available=10 * GiB)


def test_a_kv_budget_eaten_by_a_reservation_is_zero_tokens_and_negative_bytes():
    tokens, budget = kv_budget_tokens(80 * GiB, 20 * GiB, 0.8, 8 * GiB, 1 << 20)
    assert tokens == 0 and budget < 0
