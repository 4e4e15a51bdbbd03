"""SGLANG_MM_SINGLE_FLIGHT (default on): off, every image is processed on its own (an image repeated in a
request, or carried by concurrent requests, is decoded and preprocessed each time, and no identity is read in
the tokenizer process); on, once. The built requests are the same either way."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
TIMEOUT = 60


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png(0)


class _Count:
    def __init__(self, fn):
        self.fn, self.calls, self.lock = fn, 0, threading.Lock()

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.calls += 1
        return self.fn(*args, **kwargs)


def _builder(path: str, monkeypatch, on: bool) -> RequestBuilder:
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")  # items keep their pixels: the test compares them
    monkeypatch.setenv("SGLANG_MM_SINGLE_FLIGHT", "1" if on else "0")
    return RequestBuilder(ServerArgs(model_path=path, port=pick_unused_port()), path)


def _req(*images) -> GenerateReqInput:
    return GenerateReqInput(text="look " + PLACEHOLDER * len(images), image_data=list(images),
                            sampling_params={"max_new_tokens": 1})


@pytest.fixture(scope="module")
def model_path(tiny_model_dir):
    return str(tiny_model_dir("qwen3-vl-tiny"))


def _run(path, monkeypatch, on: bool):
    b = _builder(path, monkeypatch, on)
    try:
        assert b.image_loader.shared is on
        work = b.processor.load_and_process_image = _Count(b.processor.load_and_process_image)
        identify = b.image_loader.identify = _Count(b.image_loader.identify)
        digests = []
        import sglang.srt.multimodal.image_flight as flight_mod

        real_digest = flight_mod.content_digest
        monkeypatch.setattr(flight_mod, "content_digest", lambda *a: digests.append(1) or real_digest(*a))
        one, _ = b.build(b.check(_req(PNG, _png(1), PNG, PNG), "dup"))
        within = work.calls
        # three concurrent requests with the same image: shared on (timing decides how many join), never off
        out: list = [None] * 3

        def build(i):
            out[i] = b.build(b.check(_req(PNG), f"c{i}"))[0]

        threads = [threading.Thread(target=build, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        return one, within, work.calls - within, identify.calls, len(digests), b.image_loader.stats(), out
    finally:
        b.close()


def test_single_flight_off_processes_every_image_and_builds_the_same_requests(model_path, monkeypatch):
    on = _run(model_path, monkeypatch, True)
    off = _run(model_path, monkeypatch, False)
    one_on, within_on, _, _, digests_on, stats_on, _ = on
    one_off, within_off, across_off, _, digests_off, stats_off, out_off = off
    assert within_on == 2 and stats_on["mm_images_shared"] >= 2  # PNG three times: processed once
    assert within_off == 4 and across_off == 3  # every image, every request
    assert stats_off["mm_images_shared"] == 0 and stats_off["mm_images_processed"] == 7
    assert digests_on >= 4 and digests_off == 0  # no identity taken with the switch off
    assert one_on.input_ids == one_off.input_ids
    for x, y in zip(one_on.mm_inputs.mm_items, one_off.mm_inputs.mm_items):
        assert torch.equal(x.feature, y.feature) and x.hash == y.hash and x.offsets == y.offsets
    assert all(t is not None and t.mm_inputs.mm_items[0].hash == one_off.mm_inputs.mm_items[0].hash for t in out_off)


def test_single_flight_off_still_names_a_bad_image(model_path, monkeypatch):
    from sglang.srt.errors import GenerateError

    b = _builder(model_path, monkeypatch, False)
    try:
        with pytest.raises(GenerateError, match="image 1: "):
            b.build(b.check(_req(PNG, "data:image/png;base64,!!!"), "bad"))
    finally:
        b.close()


# ------------------------------------------------------------------ SGLANG_MM_DATA_URL_TEXT_KEY
class _FakeWorkers:
    """Stands in for the preprocessing worker pool (`MMProcessorPool`): runs the worker's job in this process
    and records what was sent to it."""

    num_workers, io_threads = 1, 2

    def __init__(self, processor_factory):
        self.processor_factory, self.sent = processor_factory, []

    def wait_ready(self, timeout=None):
        pass

    def close(self):
        pass

    def load_image(self, source, cfg=None):
        from sglang.srt.multimodal.image_flight import load_processed_image

        self.sent.append(type(source).__name__)
        return load_processed_image(self.processor_factory(), None, source, cfg, "xxh3_128")

    def share(self, pim, n):
        return [pim] * n


def _worker_builder(path, monkeypatch, on: bool):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")
    monkeypatch.setenv("SGLANG_MM_DATA_URL_TEXT_KEY", "1" if on else "0")
    box = {}
    pool = _FakeWorkers(lambda: box["b"].processor)
    b = box["b"] = RequestBuilder(ServerArgs(model_path=path, port=pick_unused_port()), path, mm_pool=pool)
    return b, pool


@pytest.mark.parametrize("on", [True, False])
def test_a_data_url_is_keyed_by_its_text_and_decoded_by_the_worker(model_path, monkeypatch, on):
    import base64

    import sglang.srt.multimodal.image_flight as flight_mod

    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    decodes = []
    real = flight_mod.load_image_bytes
    monkeypatch.setattr(flight_mod, "load_image_bytes", lambda *a, **k: decodes.append(1) or real(*a, **k))
    b, pool = _worker_builder(model_path, monkeypatch, on)
    try:
        assert b.image_loader.data_url_text_key is on
        built, _ = b.build(b.check(_req(url, url, PNG), "r"))
        # on: the data URL goes to the worker as text, never decoded here; the raw bytes are their own image
        assert pool.sent == (["str", "bytes"] if on else ["bytes"])
        assert len(decodes) == (1 if on else 3)  # identities read here: the raw bytes only, or all three
        # the same data URL twice is still one image; the same picture as raw bytes shares only when off
        assert b.image_loader.stats()["mm_images_shared"] == (1 if on else 2)
        items = built.mm_inputs.mm_items
        assert torch.equal(items[0].feature, items[2].feature) and items[0].hash == items[1].hash == items[2].hash
    finally:
        b.close()
