"""--limit-mm-per-prompt (vLLM's name; upstream's --limit-mm-data-per-request is the same limit) refuses a
request over the limit with a 400 naming it before any of its media is fetched or decoded: on its own, with
an unfetchable URL among its images, and inside a batch whose other prompts are fine (every prompt is
checked before any of them builds). The builder keeps serving afterwards."""

from __future__ import annotations

import asyncio
import base64
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.metrics.stage_timer import VlmStageTimer
from sglang.srt.multimodal.transport.cuda_ipc import release_unsent
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


DATA_URL = "data:image/png;base64," + base64.b64encode(_png(0)).decode()
UNFETCHABLE = "http://127.0.0.1:9/never-fetched.png"  # a private address: the fetch itself would be a 400


class _Spy:
    """Counts the calls of the wrapped callable."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture(scope="module")
def manager(tiny_model_dir):
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    args = ServerArgs(model_path=path, port=pick_unused_port(), limit_mm_per_prompt='{"image": 2, "video": 1}')
    builder = RequestBuilder(args, path)
    builder.fetcher = _Spy(lambda src, kind="image": _png(1))  # a fetch that would succeed, counted
    builder.processor.process = _Spy(builder.processor.process)
    builder.build = _Spy(builder.build)
    tm = TokenizerManager.__new__(TokenizerManager)  # no processes: only the preparing path is used
    tm.healthy, tm._closing, tm.dead_reason, tm.epd = True, False, None, None
    tm.rid_to_state, tm._preparing, tm._aborted_early = {}, {}, set()
    tm.builder, tm.stage_timer = builder, VlmStageTimer(False)
    tm._request_pool = ThreadPoolExecutor(2)
    yield tm
    tm._request_pool.shutdown()
    builder.close()


def _chat(*urls: str, rid: str) -> GenerateReqInput:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls] + [{"type": "text", "text": "hi"}]
    return GenerateReqInput(messages=[{"role": "user", "content": parts}], rid=rid,
                            sampling_params={"max_new_tokens": 2})


def _untouched(tm) -> tuple[int, int, int]:
    b = tm.builder
    return b.fetcher.calls, b.processor.process.calls, b.build.calls


def test_the_limit_is_a_400_before_any_fetch_or_decode(manager):
    before = _untouched(manager)
    obj = _chat(DATA_URL, UNFETCHABLE, DATA_URL, rid="over")
    with pytest.raises(GenerateError) as e:
        asyncio.run(manager.tokenize_request(obj))
    assert e.value.status_code == 400
    msg = str(e.value)
    assert "3 given, at most 2" in msg and "--limit-mm-per-prompt" in msg and "--limit-mm-data-per-request" in msg
    assert _untouched(manager) == before  # not fetched (the URL would have failed), decoded nor built
    assert manager._preparing == {}  # the rid is free again

    # the same images within the limit are built: the builder keeps serving
    tokenized, _ = asyncio.run(manager.tokenize_request(_chat(DATA_URL, DATA_URL, rid="ok")))
    release_unsent(manager.builder.take_unsent_shm("ok"))
    manager._preparing.clear()
    assert len(tokenized.mm_inputs.mm_items) == 2
    assert _untouched(manager)[1:] == (before[1] + 1, before[2] + 1)


def test_a_batch_is_refused_before_its_other_prompts_fetch(manager):
    before = _untouched(manager)
    groups = [[_chat("http://example.com/a.png", rid="fine")], [_chat(DATA_URL, DATA_URL, DATA_URL, rid="over")]]
    with pytest.raises(GenerateError, match="too many images: 3 given"):
        asyncio.run(manager.tokenize_requests(groups))
    # the first prompt was within the limit and would fetch its URL: it never started building
    assert _untouched(manager) == before
    assert manager._preparing == {}


def test_the_video_limit_refuses_before_decoding(manager):
    before = _untouched(manager)
    obj = GenerateReqInput(text="<|vision_start|><|video_pad|><|vision_end|>" * 2, rid="videos",
                           video_data=[UNFETCHABLE, UNFETCHABLE])
    with pytest.raises(GenerateError, match="too many videos: 2 given, at most 1"):
        asyncio.run(manager.tokenize_request(obj))
    assert _untouched(manager) == before and manager._preparing == {}
