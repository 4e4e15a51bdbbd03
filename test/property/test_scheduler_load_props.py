"""The in-process scheduler under random load against a tiny KV pool: whatever arrives when, with
whatever prompt, images and output length, every request finishes (length, stop, or abort with a
reason), no exception escapes a step, and at the end no KV slot, request slot or radix lock is held."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "managers"))
from scheduler_utils import InProcessScheduler  # noqa: E402

from sglang.srt.multimodal.processors.qwen_image import QwenVLImageProcessor

from sglang.srt.multimodal.processors.qwen_vl import QwenVLProcessor  # noqa: E402

PLACEHOLDER = [151652, 151655, 151653]
KV_TOKENS = 320


@pytest.fixture(scope="module")
def env(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    proc = QwenVLProcessor(None, QwenVLImageProcessor(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3,
                                                      min_pixels=4 * 32 * 32, max_pixels=24 * 32 * 32))
    scheds = {}

    def get(chunk: int, page: int) -> InProcessScheduler:
        key = (chunk, page)
        if key not in scheds:  # one model per configuration; each example starts from an idle scheduler
            scheds[key] = InProcessScheduler(path, max_total_tokens=KV_TOKENS, chunked_prefill_size=chunk,
                                             page_size=page, max_running_requests=6)
        s = scheds[key]
        s.sched.tree.reset()
        return s

    return get, proc


request = st.fixed_dictionaries({
    "arrive": st.integers(0, 12),  # scheduler step at which it arrives
    "text": st.integers(1, 120),
    "images": st.integers(0, 2),
    "max_new": st.integers(1, 160),
    "ignore_eos": st.booleans(),
    "abort_after": st.one_of(st.none(), st.integers(0, 20)),
})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=st.lists(request, min_size=1, max_size=8), chunk=st.sampled_from([16, 48, -1]), page=st.sampled_from([1, 4]),
       seed=st.integers(0, 1000))
def test_random_load_finishes_everything_and_leaks_nothing(env, reqs, chunk, page, seed):
    get, proc = env
    s = get(chunk, page)
    rng = np.random.default_rng(seed)
    pending = sorted(enumerate(reqs), key=lambda x: x[1]["arrive"])
    rids, aborts = {}, {}
    step = 0
    while pending or not s.sched.is_idle():
        while pending and pending[0][1]["arrive"] <= step:
            i, r = pending.pop(0)
            ids = rng.integers(0, 1500, r["text"]).tolist()
            images = []
            for _ in range(r["images"]):
                w, h = (int(x) for x in rng.integers(32, 160, 2))
                images.append(Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)))
                ids = ids[: len(ids) // 2] + PLACEHOLDER + ids[len(ids) // 2:]
            if images:
                ids, mm = proc.process(ids, images)
            else:
                mm = None
            rids[i] = s.submit(ids, mm, max_new_tokens=r["max_new"], ignore_eos=r["ignore_eos"])
            if r["abort_after"] is not None:
                aborts[rids[i]] = step + r["abort_after"]
        for rid, at in list(aborts.items()):
            if at <= step:
                s.sched.handle_abort(rid, "client went away")
                del aborts[rid]
        s.step()  # an exception here fails the property
        step += 1
        assert step < 5000, "the scheduler did not drain"
    s.sched.flush_outputs()
    s._drain()

    for i, rid in rids.items():
        reason = s.finished.get(rid)
        assert reason is not None, f"request {i} ({reqs[i]}) never finished"
        assert reason.type in ("length", "stop", "abort"), reason
        if reason.type == "abort":
            assert reason.message, reason
        else:
            assert len(s.outputs[rid]) >= 1
            assert len(s.outputs[rid]) <= reqs[i]["max_new"]
    s.assert_no_leak()
