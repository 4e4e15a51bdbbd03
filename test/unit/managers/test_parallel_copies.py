"""`n` samples and batches in the tokenizer manager (`tokenize_requests`): each prompt is built once and
its other samples are cloned from it with their own rid and seed; the prompts of a batch build at the
same time; a failing prompt releases what the others prepared."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput, TokenizedGenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.metrics.stage_timer import VlmStageTimer
from sglang.srt.sampling.sampling_params import SamplingParams


class _Builder:
    def __init__(self, parties: int = 1, fail_text: str | None = None):
        self.builds, self.clones, self.released = [], [], []
        self.barrier = threading.Barrier(parties, timeout=10)
        self.fail_text = fail_text

    def check(self, obj, rid):
        return obj, rid

    def build(self, checked):
        obj, rid = checked
        self.barrier.wait()  # every prompt of the batch must be building at once to get past this
        if obj.text == self.fail_text:
            raise GenerateError(f"bad prompt {obj.text}")
        self.builds.append(rid)
        seed = (obj.sampling_params or {}).get("seed")
        return TokenizedGenerateReqInput(rid=rid, input_ids=[1, 2], sampling_params=SamplingParams(seed=seed)), b"p"

    def can_clone(self, tokenized):
        return True

    def clone(self, tokenized, payload, rid, seed):
        self.clones.append(rid)
        return dataclasses.replace(tokenized, rid=rid, sampling_params=SamplingParams(seed=seed)), b"p"

    def take_unsent_shm(self, rid):
        self.released.append(rid)
        return []


def _manager(builder) -> TokenizerManager:
    tm = TokenizerManager.__new__(TokenizerManager)  # no processes: only the preparing path is used
    tm.healthy, tm._closing, tm.dead_reason = True, False, None
    tm.rid_to_state, tm._preparing, tm._aborted_early = {}, {}, set()
    tm.builder, tm.stage_timer = builder, VlmStageTimer(False)
    tm._request_pool = ThreadPoolExecutor(4)
    return tm


def _groups(*prompts: tuple[str, int]) -> list[list[GenerateReqInput]]:
    return [GenerateReqInput(text=t, rid=t, sampling_params={"n": n, "seed": 10}).parallel_copies()
            for t, n in prompts]


def test_a_prompt_is_built_once_for_its_samples_and_prompts_build_together():
    builder = _Builder(parties=2)
    tm = _manager(builder)
    prepared = asyncio.run(tm.tokenize_requests(_groups(("a", 3), ("b", 1))))
    assert sorted(builder.builds) == ["a-0", "b"] and builder.clones == ["a-1", "a-2"]
    assert [t.rid for t, _ in prepared] == ["a-0", "a-1", "a-2", "b"]  # prompt-major order
    assert [t.sampling_params.seed for t, _ in prepared] == [10, 11, 12, 10]
    assert set(tm._preparing) == {"a-0", "a-1", "a-2", "b"}  # prepared, waiting to be sent


def test_a_failing_prompt_answers_for_the_batch_and_releases_the_others():
    builder = _Builder(parties=2, fail_text="b")
    tm = _manager(builder)
    with pytest.raises(GenerateError, match="bad prompt b"):
        asyncio.run(tm.tokenize_requests(_groups(("a", 2), ("b", 1))))
    assert tm._preparing == {}
    assert {"a-0", "a-1", "b"} <= set(builder.released)  # every prepared sample's shared memory released


def test_a_sample_rid_in_use_is_refused_and_nothing_stays_prepared():
    builder = _Builder()
    tm = _manager(builder)
    tm._preparing["a-1"] = 0.0  # another request holds this id
    with pytest.raises(GenerateError, match="'a-1' is already in use"):
        asyncio.run(tm.tokenize_requests(_groups(("a", 2))))
    assert "a-0" not in tm._preparing and "a-0" in builder.released
