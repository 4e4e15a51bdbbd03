"""Single-flight of images in the request builder (`multimodal/image_flight.py`): concurrent requests with
the same image bytes (in any encoding) or the same URL decode, preprocess and hash it once, the others wait
for it; a failure fails all of them with the same 400; identical images inside one request are processed
once; the hash computed in the flight is the one the items would get anyway. Counted by wrapping the
processor's per-image work; concurrency is arranged with the flight's join count, never with sleeps."""

from __future__ import annotations

import base64
import dataclasses
import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.multimodal.hashing import item_hash
from sglang.srt.multimodal.image_flight import SharedImageLoader
from sglang.srt.multimodal.media_fetch import MediaFetchError
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
TIMEOUT = 60


def _png(seed: int, w: int = 96, h: int = 64) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png(0)
B64 = base64.b64encode(PNG).decode()


class _Counted:
    """Wraps a per-image function: counts calls; the first call is held until `joins` other calls have
    joined its flight (so the test knows they were concurrent), then runs (or raises `fail`)."""

    def __init__(self, fn, flight, joins: int = 0, fail: Exception | None = None):
        self.fn, self.flight, self.fail = fn, flight, fail
        self.target = flight.joined + joins
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            assert self.flight.wait_joined(self.target, TIMEOUT), "the other requests never joined the flight"
            if self.fail is not None:
                raise self.fail
        return self.fn(*args, **kwargs)


@pytest.fixture()
def builder(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")  # items keep their pixels: the test compares them
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    b = RequestBuilder(ServerArgs(model_path=path, port=pick_unused_port()), path)
    yield b
    b.close()


def _req(*images) -> GenerateReqInput:
    return GenerateReqInput(text="look " + PLACEHOLDER * len(images), image_data=list(images),
                            sampling_params={"max_new_tokens": 1})


def _build_concurrently(builder, objs) -> list:
    """builder.build of each request in its own thread; each result or the exception it raised."""
    out: list = [None] * len(objs)

    def one(i):
        try:
            out[i] = builder.build(builder.check(objs[i], f"r{i}"))[0]
        except Exception as e:  # noqa: BLE001  collected for the assertions
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(objs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    return out


def test_concurrent_requests_with_the_same_bytes_process_it_once(builder):
    loader = builder.image_loader
    work = builder.processor.load_and_process_image = _Counted(builder.processor.load_and_process_image,
                                                               loader.flight, joins=2)
    before = loader.stats()
    # the same file as base64, as a data URL and as raw bytes: one image
    out = _build_concurrently(builder, [_req(B64), _req("data:image/png;base64," + B64), _req(PNG)])
    assert work.calls == 1
    items = [t.mm_inputs.mm_items[0] for t in out]
    assert all(torch.equal(it.feature, items[0].feature) for it in items)
    assert len({it.hash for it in items}) == 1 and items[0].hash is not None
    # the hash computed in the flight is the one the item gets when hashed on its own
    assert items[0].hash == item_hash(dataclasses.replace(items[0], hash=None), builder.hash_algo)
    after = loader.stats()
    assert after["mm_images_processed"] - before["mm_images_processed"] == 1
    assert after["mm_images_shared"] - before["mm_images_shared"] == 2


def test_concurrent_requests_with_the_same_url_fetch_it_once(builder):
    loader = builder.image_loader
    fetch = builder.fetcher = _Counted(lambda url, kind="image": PNG, loader.flight, joins=2)
    url = "http://example.com/cat.png"
    out = _build_concurrently(builder, [_req(url), _req(url), _req(url)])
    assert fetch.calls == 1
    assert len({t.mm_inputs.mm_items[0].hash for t in out}) == 1


def test_a_failure_fails_every_waiting_request_with_the_same_400(builder):
    loader = builder.image_loader
    builder.fetcher = _Counted(lambda url, kind="image": PNG, loader.flight, joins=2,
                               fail=MediaFetchError("fetching http://example.com/gone.png failed: HTTP 404"))
    out = _build_concurrently(builder, [_req("http://example.com/gone.png")] * 3)
    assert all(isinstance(e, GenerateError) and e.status_code == 400 for e in out), out
    assert len({str(e) for e in out}) == 1 and "404" in str(out[0])
    assert builder.fetcher.calls == 1
    # nothing is remembered: the next request fetches again (and this time the fetch works)
    tokenized, _ = builder.build(builder.check(_req("http://example.com/gone.png"), "again"))
    assert builder.fetcher.calls == 2 and tokenized.mm_inputs.mm_items[0].hash is not None


def test_identical_images_in_one_request_are_processed_once(builder):
    work = builder.processor.load_and_process_image = _Counted(builder.processor.load_and_process_image,
                                                               builder.image_loader.flight)
    other = _png(1)
    before = builder.image_loader.stats()["mm_images_shared"]
    tokenized, _ = builder.build(builder.check(_req(B64, PNG, other, "data:image/png;base64," + B64), "one"))
    items = tokenized.mm_inputs.mm_items
    assert work.calls == 2  # PNG (three times, three encodings) and `other`
    assert items[0].hash == items[1].hash == items[3].hash != items[2].hash
    assert [it.offsets[0][1] - it.offsets[0][0] for it in items] == [items[0].num_tokens] * 3 + [items[2].num_tokens]
    assert builder.image_loader.stats()["mm_images_shared"] - before == 2


def test_a_bad_image_is_named_and_pil_images_are_never_shared(builder):
    with pytest.raises(GenerateError, match="image 1: .*base64"):  # unreadable: found while identifying it
        builder.build(builder.check(_req(B64, "data:image/png;base64,!!!"), "bad"))
    with pytest.raises(GenerateError, match="image 2: unsupported or unrecognized image format"):  # when loading
        builder.build(builder.check(_req(B64, B64, base64.b64encode(b"not an image").decode()), "bad"))
    work = builder.processor.load_and_process_image = _Counted(builder.processor.load_and_process_image,
                                                               builder.image_loader.flight)
    pil = Image.open(io.BytesIO(PNG))
    pil.load()  # decoded now: a lazily opened image is not safe to decode from two threads at once
    builder.build(builder.check(_req(pil, pil), "pil"))
    assert work.calls == 2  # no encoded form to key on: each PIL image is processed on its own


class _FakeProcessor:
    allowed_local_media_path = None

    def __init__(self, gate: threading.Event):
        self.gate, self.cfgs = gate, []

    def load_and_process_image(self, source, cfg):
        self.cfgs.append(cfg)
        if cfg == "small":  # runs only while the "large" load runs too: they must not share one flight
            assert self.gate.wait(TIMEOUT)
        else:
            self.gate.set()
        from sglang.srt.multimodal.processors.qwen_image import ProcessedImage

        return ProcessedImage(np.zeros((4, 8), np.float32), (1, 2, 2))


def test_another_processor_config_is_another_image():
    gate = threading.Event()
    proc = _FakeProcessor(gate)
    loader = SharedImageLoader(proc, key_algo="xxh3_128")
    key, src = loader.identify(PNG)
    t = threading.Thread(target=loader.load, args=(key, src, "small"))
    t.start()
    loader.load(key, src, "large")
    t.join(TIMEOUT)
    assert sorted(proc.cfgs) == ["large", "small"] and loader.flight.joined == 0
