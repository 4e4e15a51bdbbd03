"""Image and video preprocessing in worker processes (`--mm-processor-worker-num N`): the parent side.

`MMProcessorPool` spawns N processes `sglang-mmproc{k}` (`mm_worker.py`), each with its own tokenizer and
processor copy, and hands them one image or video at a time: `load_image(source, cfg)` / `load_video(source,
cfg)` sends the encoded bytes (or the URL, data URL, local path) and the request's image or video config over
the worker's private pipe, and blocks its caller (a request builder thread, never the event loop) until the
worker answers. The answer is the `ProcessedImage` / `ProcessedVideo` with its pixels in a shared-memory
segment the worker wrote (`ShmPointerMMData`): no pixel array crosses the pipe.
The segment's name is owned by the caller from then on, exactly once; `share` gives every other request of
a single flight a hard link of its own.

- **Dispatch.** To the ready worker with the fewest jobs in flight (ties in turn).
- **Failures.** A problem with the image (a 404, a corrupt file) comes back as `RemoteMediaError`, a
  ValueError with the worker's message (the request's 400). A worker that dies fails only the jobs it
  held, with `MMWorkerError` naming it (a 500); the segments it wrote for them are unlinked and it is
  started again. A worker that dies before it is ready three times in a row is given up (logged).
- **Shutdown.** `close` stops the workers, fails the jobs in flight (503) and unlinks what they wrote:
  nothing is left running and no segment of theirs remains.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future
from multiprocessing.connection import wait
from typing import Any

from sglang.srt.errors import ServerUnhealthyError, StartupError
from sglang.srt.multimodal.image_flight import share_processed
from sglang.srt.multimodal.transport.shm import SHM_DIR, ShmPointerMMData, unlink_segments

logger = logging.getLogger(__name__)

MAX_START_FAILURES = 3  # consecutive deaths before ready: the slot is given up
READY_WAIT_S = 120.0  # how long a job waits for a worker to be (re)started before failing


class MMWorkerError(RuntimeError):
    """A preprocessing worker failed a request: it died, or hit an internal error (a 500 naming it)."""


class RemoteMediaError(ValueError):
    """A worker could not use the request's image or video (fetch, decode, size, limits): the request's 400."""


class _Slot:
    """Worker position k: its current process (incarnation) and the jobs that process holds."""

    def __init__(self, index: int):
        self.index = index
        self.name = f"sglang-mmproc{index}"
        self.proc = None
        self.pid: int | None = None
        self.jobs_w = None  # parent -> worker
        self.results_r = None  # worker -> parent
        self.send_lock = threading.Lock()
        self.prefix = ""  # this incarnation's segment names start with it
        self.ready = False
        self.inflight: dict[int, Future] = {}
        self.restarts = 0
        self.start_failures = 0  # deaths before ready, in a row
        self.last_error = ""
        self.given_up = False
        self.jobs_done = 0
        self.decode_counts: dict[str, int] = {}


class MMProcessorPool:
    def __init__(self, spec, num_workers: int, io_threads: int, shm_prefix: str, hash_algo: str | None = None,
                 log_level: str = "info"):
        """`spec`: the `ProcessorSpec` each worker builds its processor from; `shm_prefix`: this server's
        segment prefix (worker segments and links are named under it, so its shutdown sweep covers them);
        `hash_algo`: the item hash computed with each image (None: not computed in the workers)."""
        if num_workers < 1:
            raise ValueError("a preprocessing worker pool needs at least one worker")
        self.spec = spec
        self.io_threads = io_threads
        self.shm_prefix = shm_prefix
        self.hash_algo = hash_algo
        self.log_level = log_level
        self._ctx = mp.get_context("spawn")
        self._cond = threading.Condition()
        self._slots = [_Slot(k) for k in range(num_workers)]
        self._job_ids = itertools.count(1)
        self._turn = 0
        self._closing = False
        self._broken = ""  # why the pool cannot serve any more (its monitor failed)
        self._retired_counts: Counter[str] = Counter()  # deferred-decode counts of dead incarnations
        self._wake_r, self._wake_w = os.pipe()
        self._monitor: threading.Thread | None = None

    @property
    def num_workers(self) -> int:
        return len(self._slots)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "MMProcessorPool":
        """Spawns every worker (not waiting for them: see `wait_ready`) and the thread that watches them."""
        try:
            for slot in self._slots:
                self._spawn(slot)
        except BaseException:
            self.close()
            raise
        self._monitor = threading.Thread(target=self._watch, name="sglang-mmproc-watch", daemon=True)
        self._monitor.start()
        return self

    def wait_ready(self, timeout: float | None = None) -> None:
        """Blocks until every worker is ready; a worker failing at start-up raises StartupError with its reason."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not all(s.ready for s in self._slots):
                if self._closing or self._broken:
                    raise StartupError(f"image preprocessing workers: {self._broken or 'closed while starting'}")
                bad = next((s for s in self._slots if s.start_failures), None)
                if bad is not None:
                    raise StartupError(f"{bad.name} failed to start: {bad.last_error or 'it exited'}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise StartupError(f"image preprocessing workers not ready within {timeout:g} s")
                self._cond.wait(left)

    def close(self) -> None:
        """Stops the workers (the jobs in flight fail with 503) and unlinks the segments of those jobs."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        os.write(self._wake_w, b"x")
        if self._monitor is not None:
            self._monitor.join(10)
        live = [s for s in self._slots if s.proc is not None]
        for slot in live:  # SIGTERM: a worker holds nothing that needs a goodbye (its jobs are failed here)
            slot.proc.terminate()
        for slot in live:
            _reap(slot.proc)
            self._retire(slot, ServerUnhealthyError("server is shutting down"))
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------------ jobs
    def load_image(self, source: bytes | str, cfg=None):
        """The `ProcessedImage` of `source` (encoded bytes or an http(s) URL) under `cfg` (None: the server's
        image config), preprocessed by a worker; its pixels in a segment now owned by the caller."""
        return self._run("image", source, cfg)

    def load_video(self, source: bytes | str, cfg=None):
        """The `ProcessedVideo` of `source` (an encoded file as bytes, or a string: http(s) URL, data URL,
        base64, allowed local path) under `cfg` (None: the server's video config): fetched, its sampled frames
        decoded, resized and patchified by a worker (`video_job.py`); its pixels in a segment now owned by the
        caller. Failures are the in-process path's: the video's problem a `RemoteMediaError` with its message."""
        return self._run("video", source, cfg)

    def load_pil(self, image, cfg=None, max_image_pixels: int | None = None):
        """The `ProcessedImage` of a PIL image (`sglang.Engine`): its RGB pixels written here into a segment of
        the caller's (`pil_handoff.to_segment`: the in-process checks and conversion, the same 400s; never a
        pickle of the image), preprocessed by a worker, and that segment unlinked once the worker has answered
        or died. Raises ShmSpaceError when /dev/shm cannot take the RGB (the caller processes it itself)."""
        from sglang.srt.multimodal.pil_handoff import to_segment

        ptr = to_segment(image, max_image_pixels, f"{self.shm_prefix}in")
        try:
            return self._run("pixels", ptr, cfg)
        finally:
            unlink_segments([ptr.name])

    def _run(self, kind: str, source: Any, cfg):
        """Sends one job to a worker and blocks its caller (a request thread) until the worker answers."""
        slot, conn, job_id, fut = self._assign()
        try:
            with slot.send_lock:
                conn.send((job_id, kind, source, cfg))
        except OSError:
            pass  # the worker is gone: its death fails this job (it is registered in the worker's jobs)
        except BaseException:
            with self._cond:
                slot.inflight.pop(job_id, None)
            raise
        return fut.result()

    def share(self, pim, n: int) -> list:
        """`pim` for n requests of one flight: the first keeps its segment name, every other gets a hard
        link of its own (no pixel copied). All or nothing: on failure every name is unlinked."""
        return share_processed(pim, n, self.shm_prefix)

    def stats(self) -> dict[str, Any]:
        """Per worker: name, pid, ready, jobs in flight and done, restarts."""
        with self._cond:
            return {"workers": [{"name": s.name, "pid": s.pid, "ready": s.ready, "jobs_in_flight": len(s.inflight),
                                 "jobs_done": s.jobs_done, "restarts": s.restarts, "given_up": s.given_up}
                                for s in self._slots],
                    "io_threads": self.io_threads}

    def decode_counts(self) -> dict[str, int]:
        """The workers' deferred-JPEG counts (`deferred_decode.stats` of each), summed."""
        with self._cond:
            total = Counter(self._retired_counts)
            for s in self._slots:
                total.update(s.decode_counts)
        return dict(total)

    def _assign(self) -> tuple[_Slot, Any, int, Future]:
        deadline = time.monotonic() + READY_WAIT_S
        with self._cond:
            while True:
                if self._closing:
                    raise ServerUnhealthyError("server is shutting down")
                if self._broken:
                    raise MMWorkerError(self._broken)
                ready = [s for s in self._slots if s.ready]
                if ready:
                    break
                if all(s.given_up for s in self._slots):
                    raise MMWorkerError("no image preprocessing worker is running: "
                                        + "; ".join(f"{s.name}: {s.last_error or 'died at start-up'}" for s in self._slots))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MMWorkerError(f"no image preprocessing worker became ready within {READY_WAIT_S:g} s")
                self._cond.wait(left)
            n = len(self._slots)
            slot = min(ready, key=lambda s: (len(s.inflight), (s.index - self._turn) % n))
            self._turn = slot.index + 1
            job_id = next(self._job_ids)
            fut: Future = Future()
            slot.inflight[job_id] = fut
            return slot, slot.jobs_w, job_id, fut

    # ------------------------------------------------------------------ workers
    def _spawn(self, slot: _Slot) -> None:
        from sglang.srt.multimodal.mm_worker import worker_main

        jobs_r, jobs_w = self._ctx.Pipe(duplex=False)
        results_r, results_w = self._ctx.Pipe(duplex=False)
        slot.prefix = f"{self.shm_prefix}p{slot.index}{uuid.uuid4().hex[:8]}_"
        proc = self._ctx.Process(
            target=worker_main, name=slot.name, daemon=True,
            args=(slot.name, self.spec, slot.prefix, self.hash_algo, self.io_threads, jobs_r, results_w,
                  os.getpid(), self.log_level))
        proc.start()
        jobs_r.close()
        results_w.close()
        slot.proc, slot.pid, slot.jobs_w, slot.results_r = proc, proc.pid, jobs_w, results_r
        slot.ready, slot.last_error = False, ""

    def _watch(self) -> None:
        """The monitor thread: reads every worker's answers and notices deaths (then restarts). Should it
        fail, the pool stops serving rather than leave jobs waiting for answers nobody reads."""
        try:
            self._watch_loop()
        except BaseException as e:  # noqa: BLE001  a bug: logged, and every job fails instead of hanging
            logger.exception("the image preprocessing workers' monitor failed")
            reason = f"image preprocessing workers unavailable: their monitor failed ({type(e).__name__}: {e})"
            with self._cond:
                self._broken = reason
                self._cond.notify_all()
            for slot in self._slots:
                if slot.proc is not None:
                    slot.proc.kill()
                    _reap(slot.proc)
                    self._retire(slot, MMWorkerError(reason))

    def _watch_loop(self) -> None:
        while True:
            with self._cond:
                if self._closing:
                    return
                live = [s for s in self._slots if s.proc is not None]
            by_obj: dict[Any, tuple[str, _Slot]] = {}
            for s in live:
                by_obj[s.results_r] = ("msg", s)
                by_obj[s.proc.sentinel] = ("exit", s)
            ready = wait([*by_obj, self._wake_r], timeout=5.0)
            exits = []
            for obj in ready:
                if obj == self._wake_r:
                    continue
                what, slot = by_obj[obj]
                if what == "exit":
                    exits.append(slot)
                elif not self._read(slot):
                    exits.append(slot)  # a broken pipe: the worker is going or gone
            for slot in dict.fromkeys(exits):
                with self._cond:
                    if self._closing:
                        return
                self._on_death(slot)

    def _read(self, slot: _Slot) -> bool:
        """Handles every message waiting from `slot`; False when its pipe is closed or broken."""
        try:
            while slot.results_r.poll():
                self._handle(slot, slot.results_r.recv())
        except (EOFError, OSError):
            return False
        except Exception:  # noqa: BLE001  a message cut short by a kill: the worker is treated as dead
            logger.exception("unreadable message from %s", slot.name)
            return False
        return True

    def _handle(self, slot: _Slot, msg) -> None:
        kind = msg[0]
        if kind == "ready":
            with self._cond:
                slot.ready = True
                slot.start_failures = 0
                self._cond.notify_all()
            return
        if kind == "error":
            slot.last_error = msg[1]
            return
        job_id, counts = msg[1], msg[-1]
        with self._cond:
            fut = slot.inflight.pop(job_id, None)
            slot.jobs_done += 1
            if counts is not None:
                slot.decode_counts = counts
        if kind == "done":
            if fut is None:  # nobody waits for it (cannot happen while the pool is open): free its segment
                ptr = msg[2].pixel_values
                if isinstance(ptr, ShmPointerMMData):
                    unlink_segments([ptr.name])
                return
            fut.set_result(msg[2])
        elif fut is not None:
            text = msg[3]
            fut.set_exception(RemoteMediaError(text) if msg[2] == "value" else MMWorkerError(f"{slot.name}: {text}"))

    def _on_death(self, slot: _Slot) -> None:
        self._read(slot)  # its last answers first: the jobs it finished are not failed
        code = _reap(slot.proc, grace=2.0)
        was_ready = slot.ready
        reason = (f"image preprocessing worker {slot.name} (pid {slot.pid}) died "
                  f"({'killed by signal ' + str(-code) if code is not None and code < 0 else f'exit code {code}'})")
        failed = self._retire(slot, MMWorkerError(f"{reason} while preprocessing this request's media; "
                                                  "it is being restarted"))
        with self._cond:
            if self._closing:
                return
            if not was_ready:
                slot.start_failures += 1
                if slot.start_failures >= MAX_START_FAILURES:
                    slot.given_up = True
                    self._cond.notify_all()
                    logger.error("%s; it failed to start %d times in a row, not restarting it: %s", reason,
                                 slot.start_failures, slot.last_error or "no reason given")
                    return
            slot.restarts += 1
        logger.warning("%s; %d request job(s) failed with it, restarting it", reason, failed)
        try:
            self._spawn(slot)
        except Exception as e:  # noqa: BLE001  e.g. no more processes allowed: the slot is given up
            logger.exception("cannot restart %s", slot.name)
            with self._cond:
                slot.given_up, slot.last_error = True, f"cannot be started: {type(e).__name__}: {e}"
                self._cond.notify_all()

    def _retire(self, slot: _Slot, error: Exception) -> int:
        """The slot's process is gone: fail its jobs with `error`, unlink what it wrote for them, close its
        pipes. Returns how many jobs failed."""
        with self._cond:
            jobs, slot.inflight = slot.inflight, {}
            slot.ready = False
            self._retired_counts.update(slot.decode_counts)
            slot.decode_counts = {}
            prefix = slot.prefix
            slot.proc = None
            self._cond.notify_all()
        if jobs:
            starts = tuple(f"{prefix}{job_id}_" for job_id in jobs)
            try:
                unlink_segments([n for n in os.listdir(SHM_DIR) if n.startswith(starts)])
            except FileNotFoundError:
                pass
        for fut in jobs.values():
            fut.set_exception(error)
        with slot.send_lock:  # no sender is inside a send on it (its descriptor is not reused under one)
            _close(slot.jobs_w)
        _close(slot.results_r)
        return len(jobs)


def _reap(proc, grace: float = 3.0) -> int | None:
    """Waits for `proc` to exit (SIGKILL after `grace` seconds); its exit code."""
    proc.join(grace)
    if proc.is_alive():
        proc.kill()
        proc.join(5.0)
    return proc.exitcode


def _close(conn) -> None:
    try:
        conn.close()
    except OSError:
        pass


__all__ = ["MMProcessorPool", "MMWorkerError", "RemoteMediaError"]
