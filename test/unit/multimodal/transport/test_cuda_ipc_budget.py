"""The KV budget leaves room for what --mm-feature-transport cuda_ipc places on a GPU after the budget is
fixed: the feature pool, the tokenizer's context and one context per peer rank that maps the pool."""

import pytest

from sglang.srt.model_executor.memory_budget import kv_budget_tokens
from sglang.srt.multimodal.transport.cuda_ipc_budget import CUDA_CONTEXT_BYTES, cuda_ipc_reserved_bytes

GiB = 1 << 30


def test_the_pool_gpu_reserves_pool_tokenizer_context_and_one_context_per_peer_rank():
    got = cuda_ipc_reserved_bytes("cuda_ipc", 4 * GiB, local_rank=0, num_local_ranks=8)
    assert got == {"pool": 4 * GiB, "tokenizer_context": CUDA_CONTEXT_BYTES, "peer_contexts": 7 * CUDA_CONTEXT_BYTES}
    assert sum(got.values()) == 4 * GiB + 8 * CUDA_CONTEXT_BYTES  # 8 GiB at TP 8 with 0.5 GiB contexts


@pytest.mark.parametrize("transport, rank", [("cpu", 0), ("cuda_ipc", 1), ("cuda_ipc", 7)])
def test_nothing_is_reserved_off_the_pool_gpu_or_without_cuda_ipc(transport, rank):
    assert cuda_ipc_reserved_bytes(transport, 4 * GiB, local_rank=rank, num_local_ranks=8) == {}


def test_tp1_reserves_no_peer_context():
    assert cuda_ipc_reserved_bytes("cuda_ipc", GiB, 0, 1)["peer_contexts"] == 0


def test_kv_budget_subtracts_resident_memory_and_the_reservation():
    total, free = 80 * GiB, 70 * GiB  # 10 GiB of weights resident
    tokens, budget = kv_budget_tokens(total, free, 0.85, 0, bytes_per_token=1 << 20)
    assert budget == int(80 * GiB * 0.85) - 10 * GiB
    reserved = sum(cuda_ipc_reserved_bytes("cuda_ipc", 4 * GiB, 0, 8).values())
    tokens_r, budget_r = kv_budget_tokens(total, free, 0.85, reserved, bytes_per_token=1 << 20)
    assert budget - budget_r == reserved
    assert tokens - tokens_r == reserved >> 20
