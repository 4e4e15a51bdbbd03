"""The scheduler's decode step takes every request's new KV slot from one allocation and records it
with host work only: the ops of forming a decode batch do not grow with the batch, each request's
slots (joined lazily) match its request-table row, and nothing leaks."""

from __future__ import annotations

import pytest
import torch

from scheduler_utils import InProcessScheduler
from sglang.srt.managers.schedule_batch import Req, append_decode_slots, kv_lens
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.testing.op_count import count_aten_ops


@pytest.fixture(scope="module")
def path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def test_req_kv_slots_are_joined_on_read():
    r = Req("a", [1, 2, 3], SamplingParams())
    r.kv_indices = torch.tensor([7, 8, 9])
    other = Req("b", [4], SamplingParams())
    for slot in (20, 21, 22):
        append_decode_slots([r, other], [slot, slot + 100])
    assert r.kv_len == 6 and kv_lens([r, other]) == [6, 3]
    assert r.kv_indices.tolist() == [7, 8, 9, 20, 21, 22] and r.kv_len == 6
    assert other.kv_indices.tolist() == [120, 121, 122]
    append_decode_slots([r], [23])
    r.kv_indices = torch.empty(0, dtype=torch.int64)  # a release drops the pending tail too
    assert r.kv_len == 0 and r.kv_indices.numel() == 0


def _decoding(path, batch, **kw):
    s = InProcessScheduler(path, **kw)
    rids = [s.submit(list(range(5 + i, 25 + 2 * i)), None, max_new_tokens=12, ignore_eos=True) for i in range(batch)]
    while s.sched.waiting or s.sched.chunked_req is not None:
        s.step()
    s.step()  # one decode step
    return s, rids


def test_forming_a_decode_batch_costs_no_op_per_request(path):
    counts = {}
    for batch in (1, 8):
        s, _ = _decoding(path, batch)
        _, counts[batch], _ = count_aten_ops(lambda: s.sched.update_running_batch().to_forward_batch("cpu"))
    # none per request: one allocation, one queued table write, the slots appended as ints
    # (KVCacheManager.extend made about a dozen per request, a one-slot view per request was left after that)
    assert counts[8] == counts[1], counts


@pytest.mark.parametrize("page_size", [1, 4])
def test_decode_slots_match_the_request_table_and_are_freed(path, page_size):
    s, rids = _decoding(path, 3, page_size=page_size)
    for _ in range(4):
        s.step()
    s.sched.resolve_in_flight()  # overlapped, the next step's slots are already taken: settle first
    pool = s.sched.kv.req_to_token_pool
    pool.apply_pending()
    for r in s.sched.running:
        slots = r.kv_indices
        assert slots.numel() == r.kv_len == len(r.fill_ids) - 1
        assert torch.equal(pool.req_to_token[r.req_pool_idx, : r.kv_len], slots)
        assert len(set(slots.tolist())) == r.kv_len
    s.run_until_idle()
    assert all(len(s.outputs[r]) == 12 for r in rids)
    s.assert_no_leak()
