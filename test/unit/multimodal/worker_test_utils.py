"""What the preprocessing-worker tests share (test_mm_worker_pool, test_request_builder_workers,
test_video_workers): a request builder with or without workers, a request built the way the tokenizer manager
builds it, the segments a builder owns, a call run on its own thread, and a wait on a condition."""

from __future__ import annotations

import os
import threading
import time

from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.multimodal.transport.shm import SHM_DIR
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.network import pick_unused_port

TIMEOUT = 300  # spawning workers on a loaded 2-core machine takes seconds; a hang fails instead of blocking


def make_builder(path: str, workers: int, **server_args) -> RequestBuilder:
    args = ServerArgs(model_path=path, port=pick_unused_port(), mm_processor_worker_num=workers,
                      allow_private_media_urls=True, media_fetch_timeout=120, **server_args)
    return RequestBuilder(args, path)


def build(builder, obj, rid: str):
    """(the tokenized request, the segments it owns), as the tokenizer manager builds one."""
    tokenized, _ = builder.build(builder.check(obj, rid))
    return tokenized, builder.take_unsent_shm(rid)


def own_segments(builder) -> set[str]:
    return {n for n in os.listdir(SHM_DIR) if n.startswith(builder.shm_prefix)}


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    """`fn(*args)` started on a thread; the list gets its result or the exception it raised."""
    out: list = []

    def run():
        try:
            out.append(fn(*args))
        except BaseException as e:  # noqa: BLE001  collected for the assertions
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def wait_until(pred, what: str) -> None:
    """Polls `pred` until it holds; fails naming `what` after TIMEOUT (a condition, not a guess at timing)."""
    deadline = time.monotonic() + TIMEOUT
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
