"""Bounded admission of a request with many images (`multimodal/bounded_fanout.py`,
--mm-max-in-flight-per-request): at most K of one request's images are loaded at a time; a request arriving
behind a huge one is processed while the huge one is still waiting on its images (fair interleaving in the
shared FIFO pool); the built request is the one the unbounded path builds. Concurrency is arranged with
gates and conditions and asserted on the recorded order of events, never on timing."""

from __future__ import annotations

import io
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.multimodal.bounded_fanout import resolve_in_flight, run_bounded
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
TIMEOUT = 60


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


class _Log:
    """Events in the order they happened, and a condition to wait on them."""

    def __init__(self):
        self.cond = threading.Condition()
        self.events: list[tuple] = []
        self.active: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    def add(self, *event) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()

    def wait(self, pred) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self), TIMEOUT), f"condition never met; events: {self.events}"

    def count(self, *prefix) -> int:
        return sum(e[:len(prefix)] == prefix for e in self.events)

    def index(self, *event) -> int:
        return self.events.index(event)


class _Gated:
    """Wraps the per-image load: records start/end per request tag, tracks the tag's loads running at once,
    and holds the loads of `gated` tags until `gate` is set."""

    def __init__(self, fn, log: _Log, tags: dict[bytes, tuple[str, int]], gated=()):
        self.fn, self.log, self.tags, self.gated = fn, log, tags, set(gated)
        self.gate = threading.Event()

    def __call__(self, source, cfg=None):
        tag, i = self.tags[bytes(source)]
        with self.log.cond:
            self.log.active[tag] = self.log.active.get(tag, 0) + 1
            self.log.peak[tag] = max(self.log.peak.get(tag, 0), self.log.active[tag])
        self.log.add("start", tag, i)
        try:
            if tag in self.gated:
                assert self.gate.wait(TIMEOUT), "the gate never opened"
            return self.fn(source, cfg)
        finally:
            with self.log.cond:
                self.log.active[tag] -= 1
            self.log.add("end", tag, i)


# ---------------------------------------------------------------------------------------------- run_bounded
class _ManualPool:
    """An executor whose jobs run only when the test says (`finish_oldest`): what `run_bounded` submitted is
    known exactly, whatever the timing."""

    def __init__(self, log: _Log):
        self.log, self.queue = log, []

    def submit(self, fn, job):
        fut = Future()
        with self.log.cond:
            self.queue.append((fut, fn, job))
            self.log.cond.notify_all()
        return fut

    def finish_oldest(self) -> None:
        with self.log.cond:
            fut, fn, job = self.queue.pop(0)
        fut.set_result(fn(job))


def test_run_bounded_keeps_at_most_k_submitted_and_returns_results_in_order(monkeypatch):
    import sglang.srt.multimodal.bounded_fanout as bf

    log = _Log()
    real_wait = bf.wait

    def logged_wait(*args, **kwargs):  # run_bounded is about to block: all it will submit for now is submitted
        log.add("waiting")
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(bf, "wait", logged_wait)
    pool = _ManualPool(log)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("out", run_bounded(pool, lambda i: i * i, list(range(20)), 3)))
    t.start()
    outstanding = []
    for k in range(20):
        log.wait(lambda lg: lg.count("waiting") > k)
        with log.cond:
            outstanding.append(len(pool.queue))
        pool.finish_oldest()
    t.join(TIMEOUT)
    assert box["out"] == [i * i for i in range(20)]
    assert max(outstanding) == 3 and outstanding[:18] == [3] * 18  # the window stays full, never over K


def test_run_bounded_raises_the_first_error_in_job_order_and_releases_and_skips_the_rest():
    released: list = []
    started: list = []
    gate, hold = threading.Event(), threading.Event()

    def fn(i):
        started.append(i)
        if i == 1:
            assert gate.wait(TIMEOUT)  # the earlier job fails after the later one did
            raise ValueError("image 1 is bad")
        if i == 2:
            gate.set()
            raise ValueError("image 2 is bad")
        if i >= 3:
            assert hold.wait(TIMEOUT)  # still running when the call fails: released when it ends
        return i

    with ThreadPoolExecutor(4) as pool:
        with pytest.raises(ValueError, match="image 1 is bad"):  # as executor.map would raise
            run_bounded(pool, fn, list(range(10)), 3, released.extend)
        hold.set()
    # every job that succeeded was released (job 3 only if its window opened before the failure was seen),
    # and no job after the window ran
    assert sorted(released) == sorted(i for i in started if i in (0, 3)) and 0 in released
    assert max(started) <= 3


def test_k_zero_is_unbounded_and_the_default_is_half_the_slots():
    assert resolve_in_flight(0, 6) == 0 and resolve_in_flight(5, 6) == 5
    assert resolve_in_flight(None, 6) == 3 and resolve_in_flight(None, 2) == 2 and resolve_in_flight(None, 32) == 16
    log = _Log()

    class Pool(ThreadPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            log.add("submit")
            return super().submit(fn, *args, **kwargs)

    release = threading.Event()

    def fn(i):
        assert release.wait(TIMEOUT)
        return i

    with Pool(2) as pool:
        # K=0: all six submitted while the first two are still held (K=2 would stop at two)
        t = threading.Thread(target=run_bounded, args=(pool, fn, list(range(6)), 0))
        t.start()
        log.wait(lambda lg: lg.count("submit") == 6)
        release.set()
        t.join(TIMEOUT)


# ---------------------------------------------------------------------------------------------- the builder
@pytest.fixture()
def builder(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "0")  # items keep their pixels: the test compares them
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    # 4 media threads, K=2: two threads stay free for the requests behind a huge one
    b = RequestBuilder(ServerArgs(model_path=path, port=pick_unused_port(), mm_io_worker_num=4,
                                  mm_max_in_flight_per_request=2), path)
    yield b
    b.close()


def _req(images) -> GenerateReqInput:
    return GenerateReqInput(text="look " + PLACEHOLDER * len(images), image_data=list(images),
                            sampling_params={"max_new_tokens": 1})


def _images(tag: str, n: int, seed: int, tags: dict) -> list[bytes]:
    out = [_png(seed + i) for i in range(n)]
    tags.update({data: (tag, i) for i, data in enumerate(out)})
    return out


def _build_in_thread(builder, obj, rid: str, log: _Log):
    box: dict = {}

    def run():
        try:
            box["out"] = builder.build(builder.check(obj, rid))
        except BaseException as e:  # noqa: BLE001  re-raised by the test
            box["err"] = e
        log.add("built", rid)

    t = threading.Thread(target=run)
    t.start()
    return t, box


def test_a_request_never_has_more_than_k_images_loading_and_builds_what_the_unbounded_path_builds(builder):
    assert builder.mm_in_flight == 2
    log, tags = _Log(), {}
    images = _images("huge", 12, 100, tags)
    plain = builder.processor.load_and_process_image
    builder.processor.load_and_process_image = _Gated(plain, log, tags)
    bounded, _ = builder.build(builder.check(_req(images), "bounded"))
    assert log.peak["huge"] <= 2 and log.count("start", "huge") == 12
    builder.mm_in_flight = 0  # the unbounded path: same request, same processor
    unbounded, _ = builder.build(builder.check(_req(images), "unbounded"))
    assert bounded.input_ids == unbounded.input_ids
    a, b = bounded.mm_inputs.mm_items, unbounded.mm_inputs.mm_items
    assert len(a) == len(b) == 12
    for x, y in zip(a, b):
        assert torch.equal(x.feature, y.feature) and x.image_grid_thw == y.image_grid_thw
        assert x.offsets == y.offsets and x.hash == y.hash
    assert torch.equal(bounded.mm_inputs.mrope_positions, unbounded.mm_inputs.mrope_positions)


def _huge_then_small(builder, n_small: int):
    """A 12-image request whose loads are held at the gate, then a request of `n_small` images. Returns the
    log, the gated loader, and the two builds' threads and result boxes."""
    log, tags = _Log(), {}
    huge = _images("huge", 12, 200, tags)
    small = _images("small", n_small, 300, tags)
    gated = builder.processor.load_and_process_image = _Gated(builder.processor.load_and_process_image, log,
                                                              tags, gated={"huge"})
    submit = builder.media_pool.submit

    def logged_submit(fn, *args, **kwargs):
        log.add("submit")
        return submit(fn, *args, **kwargs)

    builder.media_pool.submit = logged_submit
    t_huge, huge_box = _build_in_thread(builder, _req(huge), "huge", log)
    # the huge request holds as many pool threads as it may (K bounded, all 4 unbounded), and has submitted
    # every job it may (K bounded, all 12 unbounded)
    want = builder.mm_in_flight or 4
    log.wait(lambda lg: lg.count("start", "huge") == want and lg.count("submit") == (builder.mm_in_flight or 12))
    t_small, small_box = _build_in_thread(builder, _req(small), "small", log)
    return log, gated, (t_huge, huge_box), (t_small, small_box)


@pytest.mark.parametrize("n_small", [1, 2])
def test_a_small_request_behind_a_huge_one_is_built_before_the_huge_one_finishes(builder, n_small):
    log, gated, (t_huge, huge_box), (t_small, small_box) = _huge_then_small(builder, n_small)
    log.wait(lambda lg: lg.count("built", "small") == 1)  # while every load of the huge request is held
    assert "err" not in small_box, small_box.get("err")
    assert log.count("start", "huge") == 2 and log.count("end", "huge") == 0
    gated.gate.set()
    t_huge.join(TIMEOUT)
    t_small.join(TIMEOUT)
    assert "err" not in huge_box, huge_box.get("err")
    assert log.index("built", "small") < log.index("built", "huge")
    assert log.peak["huge"] == 2 and len(small_box["out"][0].mm_inputs.mm_items) == n_small


def test_unbounded_the_small_request_queues_behind_every_image_of_the_huge_one(builder):
    builder.mm_in_flight = 0
    log, gated, (t_huge, huge_box), (t_small, small_box) = _huge_then_small(builder, 2)
    log.wait(lambda lg: lg.count("submit") == 14)  # its two jobs queued behind the huge one's eight waiting
    gated.gate.set()
    t_huge.join(TIMEOUT)
    t_small.join(TIMEOUT)
    assert "err" not in huge_box and "err" not in small_box
    # FIFO: the small request's first image started only after the huge request's last one had
    assert log.index("start", "huge", 11) < min(log.index("start", "small", i) for i in range(2))


def test_a_bad_image_in_a_bounded_request_is_the_same_400(builder):
    good = [_png(400 + i) for i in range(5)]
    bad = good[:3] + [b"not an image"] + good[3:]
    with pytest.raises(GenerateError, match="image 3: unsupported or unrecognized image format"):
        builder.build(builder.check(_req(bad), "bad"))


# ---------------------------------------------------------------------------------------------- spilling
@pytest.fixture()
def shm_builder(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("SGLANG_MM_SHM_TRANSPORT", "1")
    path = str(tiny_model_dir("qwen3-vl-tiny"))
    b = RequestBuilder(ServerArgs(model_path=path, port=pick_unused_port(), mm_io_worker_num=4,
                                  mm_max_in_flight_per_request=2), path)
    yield b
    b.close()


def test_bounded_in_process_loads_leave_the_process_as_each_image_is_done(shm_builder):
    """With the shared-memory transport and no workers, each finished image's pixels go to a segment of their
    own when its load ends (so the process holds only the K images being loaded), every segment has one
    owner, and the pixels are the ones the unbounded path sends."""
    b = shm_builder
    assert b.image_loader.spill_prefix == b.shm_prefix
    images = [_png(500 + i) for i in range(6)]
    images.append(images[0])  # one image twice: two items, two names
    loads = []
    plain = b.image_loader._load

    def spy(source, cfg):
        out = plain(source, cfg)
        loads.append(type(out.pixel_values).__name__)  # what the load returns: spilled right after this
        return out

    b.image_loader._load = spy
    bounded, _ = b.build(b.check(_req(images), "bounded"))
    names_bounded = b.take_unsent_shm("bounded")
    b.image_loader._load = plain
    b.mm_in_flight = 0
    b.image_loader.spill_prefix = None  # the path before: pixels kept until the request is sent
    unbounded, _ = b.build(b.check(_req(images), "unbounded"))
    names_unbounded = b.take_unsent_shm("unbounded")
    try:
        assert loads == ["ndarray"] * 6
        ptrs = [it.feature for it in bounded.mm_inputs.mm_items]
        assert all(type(p).__name__ == "ShmPointerMMData" for p in ptrs)
        assert len({p.name for p in ptrs}) == 7 and sorted(names_bounded) == sorted(p.name for p in ptrs)
        assert bounded.input_ids == unbounded.input_ids
        for x, y in zip(bounded.mm_inputs.mm_items, unbounded.mm_inputs.mm_items):
            assert torch.equal(x.feature.materialize(copy=True), y.feature.materialize(copy=True))
            assert x.hash == y.hash and x.image_grid_thw == y.image_grid_thw
    finally:
        from sglang.srt.multimodal.transport.shm import unlink_segments

        unlink_segments(names_bounded + names_unbounded)


def test_a_failed_bounded_request_leaves_no_segment(shm_builder):
    import os

    from sglang.srt.multimodal.transport.shm import SHM_DIR

    def mine():
        return {n for n in os.listdir(SHM_DIR) if n.startswith(shm_builder.shm_prefix)}

    before = mine()
    bad = [_png(600 + i) for i in range(5)] + [b"not an image"]
    with pytest.raises(GenerateError, match="image 5"):
        shm_builder.build(shm_builder.check(_req(bad), "bad"))
    shm_builder.media_pool.submit(lambda: None).result()  # the pool is idle: every job of the request ended
    assert mine() == before


def test_a_negative_bound_is_refused_by_name(tiny_model_dir):
    with pytest.raises(ValueError, match="--mm-max-in-flight-per-request must be in"):
        ServerArgs(model_path=str(tiny_model_dir("qwen3-vl-tiny")), mm_max_in_flight_per_request=-1)
