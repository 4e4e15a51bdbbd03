"""TokenizerManager: the asyncio front half of the engine, living in the HTTP server's (or Engine's) process.

Turns a `GenerateReqInput` into a `TokenizedGenerateReqInput` (chat template, tokenization, image loading
and preprocessing in worker threads, validation), sends it to scheduler rank 0 over ZMQ, and dispatches
the `BatchStrOut`s coming back from the detokenizer to the waiting requests. It also watches the child
processes: one dying makes the server unhealthy and fails every pending request with 503.

Split by concern: the receive side and outputs in tokenizer_output_mixin.py, the control requests in
tokenizer_communicator_mixin.py, /tokenize and /detokenize in tokenizer_text_mixin.py; preparing, sending,
aborts, health and lifecycle stay here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.process import BaseProcess
from typing import Any, AsyncIterator, Callable

from sglang.srt.environ import envs
from sglang.srt.errors import GenerateError, ServerUnhealthyError
from sglang.srt.managers.data_parallel_messages import request_header
from sglang.srt.managers.io_struct import AbortReq, FinishReason, GenerateReqInput, SchedulerReady, TokenizedGenerateReqInput
from sglang.srt.managers.request_builder import RequestBuilder
from sglang.srt.managers.stop_holdback import StopHoldback
from sglang.srt.managers.tokenizer_communicator_mixin import TokenizerCommunicatorMixin, _ControlWait
from sglang.srt.managers.tokenizer_output_mixin import TokenizerOutputMixin, _ReqState
from sglang.srt.managers.tokenizer_text_mixin import TokenizerTextMixin
from sglang.srt.managers.tokenizer_update_weights_mixin import TokenizerUpdateWeightsMixin
from sglang.srt.metrics.prometheus import ServingMetrics
from sglang.srt.multimodal.transport.cuda_ipc import release_unsent
from sglang.srt.server_args import PortArgs, ServerArgs

__all__ = ["GenerateError", "ServerUnhealthyError", "TokenizerManager"]

logger = logging.getLogger(__name__)

UNSENT_SHM_MAX_AGE_S = 30.0


class TokenizerManager(TokenizerUpdateWeightsMixin, TokenizerCommunicatorMixin, TokenizerOutputMixin,
                       TokenizerTextMixin):
    dp_size = 1  # replicas answering each control request (set in __init__ from --dp-size)
    ids_only = False  # --skip-tokenizer-init: outputs carry output_ids and no text (set in __init__)
    epd = None  # --language-only: the encoders' dispatcher (set in __init__)
    epd_inbox = None

    def __init__(self, server_args: ServerArgs, port_args: PortArgs, scheduler_info: SchedulerReady | None = None,
                 mm_pool=None):
        """`mm_pool`: the image preprocessing workers started at launch (`mm_worker_plan.start_worker_pool`)."""
        self.server_args = server_args
        self.port_args = port_args
        self.scheduler_info = scheduler_info
        self.dp_size = server_args.dp_size
        self.ids_only = server_args.skip_tokenizer_init
        self.model_path = server_args.resolved_model_path()
        self.builder = RequestBuilder(server_args, self.model_path, scheduler_info, mm_pool)
        self.tokenizer = self.builder.tokenizer
        self.processor = self.builder.processor
        self.hf_config = self.builder.hf_config
        self.context_length = self.builder.context_length
        self.stage_timer = self.builder.stage_timer
        self.metrics = ServingMetrics(server_args.served_model_name or self.model_path) if server_args.enable_metrics else None
        self._request_pool = ThreadPoolExecutor(min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="sglang-req")

        self.rid_to_state: dict[str, _ReqState] = {}
        # Requests between tokenize_request and generate_tokenized (images decoding, not yet sent):
        # rid -> when preparing began. An abort_request meeting one marks it in _aborted_early, and
        # generate_tokenized then ends it before it reaches a scheduler.
        self._preparing: dict[str, float] = {}
        self._aborted_early: set[str] = set()

        self.healthy = True
        self.dead_reason: str | None = None
        self.has_served = False  # an output came back through scheduler and detokenizer (/ready)
        self._closing = False
        self._control_waiters: dict[int, _ControlWait] = {}  # control request id -> its replies
        self._control_ids = itertools.count(1)
        # the gate between requests and weight updates (tokenizer_update_weights_mixin.py)
        self._init_weight_updates(server_args.weight_version, server_args.weight_update_drain_timeout,
                                  server_args.language_only)
        self._background: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._zmq_ctx = None
        self._send_sock = None
        self._recv_sock = None
        self._on_child_death: Callable[[str], None] | None = None
        self._watch_stop = threading.Event()
        if server_args.language_only:  # managers/encode_receiver.py
            from sglang.srt.managers.encode_receiver import EmbeddingInbox, EncodeDispatcher

            to_tokenizer = server_args.encoder_transfer_backend == "zmq_to_tokenizer"
            self.epd_inbox = EmbeddingInbox() if to_tokenizer else None
            from sglang.srt.disaggregation.model_identity import model_identity

            model_dir = server_args.resolved_model_path()
            self.epd = EncodeDispatcher(server_args.encoder_urls, server_args.encoder_transfer_backend,
                                        port_args.epd_embedding_addr, envs.SGLANG_ENCODER_TIMEOUT_S.get(),
                                        self.epd_inbox, api_key=server_args.api_key,
                                        identity=lambda: model_identity(model_dir))

    # ------------------------------------------------------------------ lifecycle
    async def start(
        self,
        child_processes: list[BaseProcess] | None = None,
        on_child_death: Callable[[str], None] | None = None,
    ) -> None:
        """Open the sockets and start the receive loop (and the child watchdog) on the running loop."""
        import zmq
        import zmq.asyncio

        self._loop = asyncio.get_running_loop()
        self._zmq_ctx = zmq.asyncio.Context(2)
        self._recv_sock = self._zmq_ctx.socket(zmq.PULL)
        self._recv_sock.bind(self.port_args.tokenizer_ipc_name)
        self._send_sock = self._zmq_ctx.socket(zmq.PUSH)
        self._send_sock.connect(self.port_args.scheduler_input_ipc_name)
        self._spawn(self._handle_loop())
        if self.epd_inbox is not None:  # zmq_to_tokenizer: the encoders push embeddings here
            from sglang.srt.disaggregation.encode_protocol import bind_endpoint
            from sglang.srt.disaggregation.encode_wire import mac_key

            inbox_sock = self._zmq_ctx.socket(zmq.PULL)
            inbox_sock.setsockopt(zmq.MAXMSGSIZE, envs.SGLANG_EPD_MAX_EMBEDDING_MB.get() << 20)
            inbox_sock.bind(bind_endpoint(self.port_args.epd_embedding_addr, self.server_args.host))
            self._spawn(self.epd_inbox.run(inbox_sock, mac_key(self.server_args.api_key),
                                           envs.SGLANG_EPD_MAX_EMBEDDING_MB.get() << 20))
        if self.epd is not None:  # every encoder that answers must serve this model: refuse to start otherwise
            mismatches = await self.epd.register_all()
            if mismatches:
                raise RuntimeError("; ".join(mismatches))
        self._spawn(self._sweep_unsent_shm())
        self._on_child_death = on_child_death
        if child_processes:
            threading.Thread(
                target=self._watch_children, args=(list(child_processes),), name="sglang-watchdog", daemon=True
            ).start()

    async def close(self) -> None:
        """Stop receiving and watching (call before killing the children)."""
        self._closing = True
        self._watch_stop.set()
        for task in list(self._background):
            task.cancel()
        for state in self.rid_to_state.values():
            state.error = ServerUnhealthyError("server is shutting down")
            state.event.set()
        self.rid_to_state.clear()
        if self.epd is not None:
            await self.epd.close()
        if self._zmq_ctx is not None:
            self._zmq_ctx.destroy(linger=0)
            self._zmq_ctx = None
        self._request_pool.shutdown(wait=False, cancel_futures=True)
        self.builder.close()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ health
    @property
    def accepting(self) -> bool:
        """Healthy and not shutting down: new requests are taken."""
        return self.healthy and not self._closing

    def _raise_if_unhealthy(self) -> None:
        if not self.healthy:
            raise ServerUnhealthyError(f"server unavailable: {self.dead_reason}")
        if self._closing:
            raise ServerUnhealthyError("server is shutting down")

    def _watch_children(self, procs: list[BaseProcess]) -> None:
        from multiprocessing.connection import wait

        by_sentinel = {p.sentinel: p for p in procs}
        while not self._watch_stop.is_set():
            ready = wait(list(by_sentinel), timeout=0.5)
            if ready and not self._watch_stop.is_set():
                p = by_sentinel[ready[0]]
                p.join(timeout=1.0)
                msg = f"{p.name} process (pid {p.pid}) exited unexpectedly with exit code {p.exitcode}"
                try:
                    self._loop.call_soon_threadsafe(self.mark_dead, msg)
                except RuntimeError:  # the loop is already closed: nothing left to notify
                    pass
                return

    def fail_pending(self, reason: str) -> None:
        """Every request in flight answers 503 with `reason` now (their schedulers' work is aborted as
        their handlers leave); new requests are refused from here on."""
        self._closing = True
        states = list(self.rid_to_state.values())
        for state in states:
            state.error = ServerUnhealthyError(reason)
            state.event.set()
        if states:
            logger.warning("%s: answering %d request(s) in flight with 503", reason, len(states))

    def mark_dead(self, reason: str) -> None:
        """The server cannot serve any more: fail everything pending with 503 and notify the owner."""
        if self._closing or not self.healthy:
            return
        self.healthy = False
        self.dead_reason = reason
        logger.error("%s; failing %d pending request(s)", reason, len(self.rid_to_state))
        err = ServerUnhealthyError(f"server unavailable: {reason}")
        for state in self.rid_to_state.values():
            state.error = err
            state.event.set()
        self.rid_to_state.clear()
        for wait in list(self._control_waiters.values()):
            if not wait.future.done():
                wait.future.set_exception(err)
        if self._on_child_death is not None:
            self._on_child_death(reason)

    # ------------------------------------------------------------------ generate
    async def generate_request(self, obj: GenerateReqInput) -> AsyncIterator[dict[str, Any]]:
        """Yields stream chunks (`obj.stream`) or one final output: {"text", "output_ids", "meta_info"}."""
        tokenized, payload = await self.tokenize_request(obj)
        async for out in self.generate_tokenized(tokenized, payload):
            yield out

    async def tokenize_request(self, obj: GenerateReqInput, checked=None) -> tuple[TokenizedGenerateReqInput, bytes]:
        """Validates and prepares one request (`checked`: `_check_request(obj)` if already done); raises
        GenerateError (400) naming any problem."""
        rid, checked = checked if checked is not None else self._check_request(obj)
        try:
            # a grammar is not compiled here: the scheduler ranks compile it (once each) and answer a 400 naming
            # the problem; `check` did the cheap part (size limit, JSON parse, a grammar backend to compile it)
            built = await asyncio.get_running_loop().run_in_executor(self._request_pool, self.builder.build, checked)
            if self.epd is not None and built[0].mm_inputs is not None:
                built = await self._encode_remotely(built[0])
            return built
        except BaseException as e:
            self._forget_preparing(rid)
            release_unsent(self.builder.take_unsent_shm(rid))  # built, then refused or cancelled: never sent
            if not isinstance(e, GenerateError):
                self._raise_if_unhealthy()  # shut down under it (pool cancelled): 503, not a 500
            raise

    def _check_request(self, obj: GenerateReqInput):
        """(rid, checked request): health, a free rid (registered as preparing), `RequestBuilder.check` (media
        counts against --limit-mm-per-prompt among them); nothing is fetched or decoded yet."""
        self._raise_if_unhealthy()
        rid = obj.rid or uuid.uuid4().hex
        if rid in self.rid_to_state or rid in self._preparing:
            raise GenerateError(f"request id {rid!r} is already in use")
        if not obj.created_time:
            obj.created_time = time.time()
        self._preparing[rid] = time.monotonic()
        try:
            return rid, self.builder.check(obj, rid)
        except BaseException:
            self._forget_preparing(rid)
            raise

    async def _encode_remotely(self, tokenized: TokenizedGenerateReqInput) -> tuple[TokenizedGenerateReqInput, bytes]:
        """--language-only: the items go to the encoders (400 for a bad item, 503 when none answers);
        the request is pickled again without pixels (and, zmq_to_tokenizer, with the embeddings)."""
        timings = await self.epd.encode(tokenized)
        if self.stage_timer.enabled:
            for stage, ms in timings.items():
                self.stage_timer.add(tokenized.stage_timings_ms, stage, ms)
            self.stage_timer.emit(tokenized.rid, timings, tuple(timings))
        tokenized.send_time = time.time()
        payload = await asyncio.get_running_loop().run_in_executor(
            self._request_pool, pickle.dumps, tokenized, pickle.HIGHEST_PROTOCOL)
        return tokenized, payload

    async def tokenize_requests(
        self, groups: list[list[GenerateReqInput]]
    ) -> list[tuple[TokenizedGenerateReqInput, bytes]]:
        """Prepares a batch: each group is one prompt's `n` samples (`GenerateReqInput.parallel_copies`).
        A group's first sample is built (template, tokens, media fetched, decoded, hashed and written to
        shared memory once) and the others are cloned from it with their own rid and seed; the groups
        build concurrently. Returns every sample in group order. A problem with any prompt raises that of
        the first failing prompt, after whatever the others prepared is released (nothing is sent).
        Every prompt is checked before any of them starts building, so a prompt over a limit
        (--limit-mm-per-prompt) refuses the batch before any image of it is fetched or decoded."""
        checked = []
        try:
            for g in groups:
                checked.append(self._check_request(g[0]))
        except BaseException:
            for rid, _ in checked:
                self._forget_preparing(rid)
            raise
        results = await asyncio.gather(*(self._tokenize_copies(g, c) for g, c in zip(groups, checked)),
                                       return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            for r in results:
                if not isinstance(r, BaseException):
                    for tokenized, _ in r:
                        self.discard_prepared(tokenized.rid)
            raise failed
        return [p for r in results for p in r]

    async def _tokenize_copies(self, copies: list[GenerateReqInput],
                               checked=None) -> list[tuple[TokenizedGenerateReqInput, bytes]]:
        first, payload = await self.tokenize_request(copies[0], checked)
        out = [(first, payload)]
        try:
            for copy in copies[1:]:
                if not self.builder.can_clone(first):
                    out.append(await self.tokenize_request(copy))
                    continue
                self._raise_if_unhealthy()
                rid = copy.rid or uuid.uuid4().hex
                if rid in self.rid_to_state or rid in self._preparing:
                    raise GenerateError(f"request id {rid!r} is already in use")
                self._preparing[rid] = time.monotonic()
                params = copy.sampling_params or {}
                seed = params.get("seed") if params.get("seed") is not None else params.get("sampling_seed")
                try:
                    out.append(await asyncio.get_running_loop().run_in_executor(
                        self._request_pool, self.builder.clone, first, payload, rid, seed))
                except BaseException:
                    self.discard_prepared(rid)
                    raise
        except BaseException:
            for tokenized, _ in out:
                self.discard_prepared(tokenized.rid)
            raise
        return out

    def discard_prepared(self, rid: str) -> None:
        """A prepared request that will not be sent: forget it and release its shared memory."""
        self._forget_preparing(rid)
        release_unsent(self.builder.take_unsent_shm(rid))

    def _forget_preparing(self, rid: str) -> bool:
        """Ends `rid`'s preparing phase; True when an abort_request arrived during it."""
        self._preparing.pop(rid, None)
        if rid in self._aborted_early:
            self._aborted_early.discard(rid)
            return True
        return False

    async def generate_tokenized(
        self, tokenized: TokenizedGenerateReqInput, payload: bytes | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        self._raise_if_unhealthy()
        rid = tokenized.rid
        if rid in self.rid_to_state:
            raise GenerateError(f"request id {rid!r} is already in use")
        sp = tokenized.sampling_params
        holdback = StopHoldback(sp.stop, sp.stop_regex) if tokenized.stream and not sp.no_stop_trim else None
        state = _ReqState(rid, tokenized.stream, holdback, tokenized.created_time, logprob_text=sp.return_text_in_logprobs)
        if self._forget_preparing(rid):  # aborted while its images were decoding: never sent
            release_unsent(self.builder.take_unsent_shm(rid))
            state.finished_reason = FinishReason("abort", message="aborted by an abort_request")
            yield self._final_output(state)
            return
        await self._wait_weights_ready()  # a weight update in progress: sent once it is over
        if rid in self.rid_to_state:
            raise GenerateError(f"request id {rid!r} is already in use")
        self.rid_to_state[rid] = state
        self._request_started(state)  # over when the scheduler finishes it (_handle_batch_str_out) or we leave
        try:
            if payload is None:
                payload = pickle.dumps(tokenized, protocol=pickle.HIGHEST_PROTOCOL)
            unsent = self.builder.take_unsent_shm(rid)
            try:
                self._raise_if_unhealthy()
                if self.dp_size > 1:  # the data-parallel controller routes by a small header
                    header = request_header(rid, len(tokenized.input_ids), tokenized.routed_dp_rank)
                    await self._send_sock.send_multipart([header, payload], copy=False)
                else:
                    await self._send_sock.send(payload, copy=False)
            except BaseException:
                release_unsent(unsent)  # never reached a scheduler: nobody else will release it
                self._raise_if_unhealthy()  # the socket went away with a shutdown: 503, not a 500
                raise
            if self.stage_timer.enabled:
                if tokenized.send_time:
                    self.stage_timer.add(state.stage_timings, "send", (time.time() - tokenized.send_time) * 1e3)
                self.stage_timer.emit(rid, {**tokenized.stage_timings_ms, **state.stage_timings},
                                      ("processor", "video_decode", "video_preprocess", "send"))
            if self.metrics is not None and tokenized.mm_inputs is not None:
                self.metrics.observe_mm_items(tokenized.mm_inputs.mm_items)
            while True:
                await state.event.wait()
                state.event.clear()
                if state.error is not None:
                    raise state.error
                if state.finished_reason is not None:
                    yield self._final_output(state)
                    return
                if state.stream:
                    out = self._stream_output(state)
                    if out is not None:
                        yield out
        finally:
            self._request_ended(state)
            if self.rid_to_state.get(rid) is state:  # left early: client gone or cancelled
                self._forget_and_abort(rid)

    def abort_request(self, rid: str = "", abort_all: bool = False) -> int:
        """Ends running requests on purpose (`/abort_request`): `rid`, or every request with
        `abort_all`. The scheduler drops them (freeing their KV slots) and reports them finished with
        reason "abort", which their callers receive as their last output. Unknown ids are ignored.
        Returns how many requests were asked to stop."""
        rids = list(self.rid_to_state) if abort_all else [rid] if rid in self.rid_to_state else []
        for r in rids:
            self._send_abort(r, "aborted by an abort_request")
        early = list(self._preparing) if abort_all else [rid] if rid in self._preparing else []
        self._aborted_early.update(early)
        return len(rids) + len(early)

    def _forget_and_abort(self, rid: str) -> None:
        """Forget `rid` (its caller is gone) and tell the scheduler to drop it. Never blocks."""
        self.rid_to_state.pop(rid, None)
        self._send_abort(rid, "aborted by client")

    def _send_abort(self, rid: str, reason: str) -> None:
        if self._send_sock is None or self._closing or not self.healthy:
            return
        # Not awaited: this runs from cancelled tasks, where another await would be cancelled too.
        self._send_sock.send_pyobj(AbortReq(rid=rid, reason=reason)).add_done_callback(_log_send_failure)

    async def _sweep_unsent_shm(self, max_age_s: float = UNSENT_SHM_MAX_AGE_S) -> None:
        """Unlinks the segments of prepared requests that were never sent (their caller went away
        between preparing and sending). Sent requests' segments are the schedulers' to unlink."""
        while True:
            await asyncio.sleep(max_age_s / 4)
            release_unsent(self.builder.expired_unsent_shm(max_age_s))
            now = time.monotonic()
            for rid in [r for r, t in self._preparing.items() if now - t > max_age_s]:
                self._forget_preparing(rid)  # prepared, never sent: its caller went away


def _log_send_failure(fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        logger.warning("could not send an abort to the scheduler: %s", fut.exception())
