"""`Engine.generate` with `n` > 1 builds each prompt's multimodal input once and clones it for the other
samples (the tokenizer manager's `tokenize_requests`, as the HTTP routes do): for n=4 the image goes
through the processor (load, decode, preprocess) and is hashed once, and four requests with their own
rids and seeds are sent. The engine runs over the real request builder on the tiny model; only the
scheduler and detokenizer are stood in for (each sent request answers at once with its rid)."""

from __future__ import annotations

import asyncio
import io
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pybase64
import pytest
from PIL import Image

from sglang.srt.entrypoints.engine import Engine
from sglang.srt.managers import request_builder
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def _png_data_url() -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(buf, "PNG")
    return "data:image/png;base64," + pybase64.b64encode(buf.getvalue()).decode()


@pytest.fixture
def engine(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")  # pixels inline: no scheduler to map segments
    monkeypatch.setenv("SGLANG_MM_PRECOMPUTE_HASH", "1")  # the tokenizer side hashes: countable here
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    args = ServerArgs(model_path=path)
    builder = RequestBuilder(args, path)
    counts = {"process": 0, "hash": 0}
    process, hashes = builder.processor.process, request_builder.precompute_item_hashes

    def counted_process(*a, **k):
        counts["process"] += 1
        return process(*a, **k)

    def counted_hashes(*a, **k):
        counts["hash"] += 1
        return hashes(*a, **k)

    builder.processor.process = counted_process
    monkeypatch.setattr(request_builder, "precompute_item_hashes", counted_hashes)

    tm = TokenizerManager.__new__(TokenizerManager)  # the preparing path only: no sockets, no processes
    tm.server_args, tm.healthy, tm._closing, tm.dead_reason = args, True, False, None
    tm.rid_to_state, tm._preparing, tm._aborted_early = {}, {}, set()
    tm.builder, tm.stage_timer = builder, builder.stage_timer
    tm._request_pool = ThreadPoolExecutor(4)
    sent = []

    async def generate_tokenized(tokenized, payload=None):  # stands in for scheduler and detokenizer
        tm._forget_preparing(tokenized.rid)
        sent.append(tokenized)
        yield {"text": tokenized.rid, "output_ids": [], "meta_info": {"id": tokenized.rid}}

    tm.generate_tokenized = generate_tokenized
    eng = Engine.__new__(Engine)
    eng.server_args, eng._closed, eng.tokenizer_manager = args, False, tm
    eng._loop = asyncio.new_event_loop()
    thread = threading.Thread(target=eng._loop.run_forever, daemon=True)
    thread.start()
    yield eng, counts, sent
    eng._loop.call_soon_threadsafe(eng._loop.stop)
    thread.join(10)
    tm._request_pool.shutdown()
    builder.close()


def test_n_samples_build_the_image_once(engine):
    eng, counts, sent = engine
    outs = eng.generate(prompt="see " + PLACEHOLDER, image_data=_png_data_url(),
                        sampling_params={"n": 4, "max_new_tokens": 2, "seed": 7})
    assert counts == {"process": 1, "hash": 1}, counts
    assert len(outs) == 4 and len({o["text"] for o in outs}) == 4  # one output per sample, each its own rid
    assert [t.sampling_params.seed for t in sent] == [7, 8, 9, 10]
    first = sent[0].mm_inputs.mm_items[0]
    assert all(t.mm_inputs.mm_items[0].hash == first.hash for t in sent)
    assert not eng.tokenizer_manager._preparing


def test_a_streamed_batch_builds_each_prompt_once(engine):
    eng, counts, sent = engine
    chunks = list(eng.generate(prompt=["a " + PLACEHOLDER, "b " + PLACEHOLDER], image_data=[[_png_data_url()]] * 2,
                               sampling_params={"n": 2, "max_new_tokens": 2}, stream=True))
    assert counts == {"process": 2, "hash": 2}, counts
    assert sorted(c["index"] for c in chunks) == [0, 1, 2, 3] and len(sent) == 4
