"""The scheduler's input side: receiving requests (rank 0 from the tokenizer manager, then the TP
broadcast), mapping shared-memory pixels after it, validating and queueing requests, aborts, and the
control requests (flush cache, server info, profiling)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

import zmq

from sglang.srt.distributed.communication_op import all_gather_pyobj, broadcast_pyobj
from sglang.srt.managers.io_struct import (
    AbortReq,
    FinishReason,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetLoadReq,
    GetLoadReqOutput,
    GetServerInfoReq,
    GetServerInfoReqOutput,
    ProfileReq,
    ReplicaLoadReport,
    TokenizedGenerateReqInput,
    UpdateWeightFromDiskReqInput,
)
from sglang.srt.managers.mm_utils import pad_input_ids
from sglang.srt.managers.profiler import SchedulerProfiler
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.multimodal import deferred_decode
from sglang.srt.multimodal.hashing import ensure_item_hashes
from sglang.srt.multimodal.transport.cuda_ipc import ipc_receiver_stats, materialize_ipc_features
from sglang.srt.multimodal.transport.shm import materialize_mm_features, unlink_segments

logger = logging.getLogger(__name__)

_TOKENIZER_LOAD_LOCK = threading.Lock()  # one HF tokenizer load per process


class SchedulerIOMixin:
    _profiler: SchedulerProfiler | None = None  # made by the first ProfileReq
    grammar_queue = None  # constrained requests compiling their grammar (the Scheduler sets it)
    dp_rank = 0  # the data-parallel replica (the Scheduler sets it)
    load_socket = None  # --dp-size > 1, rank 0: ReplicaLoadReports to the data-parallel controller
    num_received_reqs = 0  # generation requests (and their prompt tokens) received since start
    num_received_tokens = 0
    _last_load_report: tuple | None = None
    epd_rendezvous = None  # --language-only, zmq_to_scheduler, rank 0: requests waiting for their embeddings
    epd_socket = None  # ... and at --dp-size 1 the tcp socket encoders push them to

    # ------------------------------------------------------------------ input
    @property
    def tokenizer(self):
        """Loaded once per process on first use: from the loop (stop strings) or the grammar compile
        thread (xgrammar's vocabulary view), hence the lock around the load."""
        if self._tokenizer is None:
            with _TOKENIZER_LOAD_LOCK:
                if self._tokenizer is None:
                    from transformers import AutoTokenizer

                    self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_path)
        return self._tokenizer

    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked_req or self.grammar_queue or self._launched)

    def init_epd_receiver(self, server_args, port_args, ctx) -> None:
        """Encoder disaggregation with zmq_to_scheduler: rank 0 holds requests until their embeddings came
        (`EmbeddingRendezvous`); at --dp-size 1 it binds the endpoint encoders push them to (at --dp-size > 1
        the data-parallel controller binds it and forwards them to the replica of their request)."""
        if not server_args.language_only or server_args.encoder_transfer_backend != "zmq_to_scheduler":
            return
        from sglang.srt.disaggregation.encode_protocol import bind_endpoint
        from sglang.srt.managers.encode_receiver import EmbeddingRendezvous
        from sglang.srt.disaggregation.encode_wire import mac_key
        from sglang.srt.environ import envs

        self.epd_rendezvous = EmbeddingRendezvous(envs.SGLANG_ENCODER_TIMEOUT_S.get())
        self.epd_limits = (mac_key(server_args.api_key), envs.SGLANG_EPD_MAX_EMBEDDING_MB.get() << 20)
        if server_args.dp_size == 1:
            self.epd_socket = ctx.socket(zmq.PULL)
            self.epd_socket.setsockopt(zmq.MAXMSGSIZE, self.epd_limits[1])
            self.epd_socket.bind(bind_endpoint(port_args.epd_embedding_addr, server_args.host))

    def _input_ready(self, timeout_ms: int) -> bool:
        if self.epd_socket is None:
            return bool(self.recv_socket.poll(timeout=timeout_ms))
        poller = zmq.Poller()
        poller.register(self.recv_socket, zmq.POLLIN)
        poller.register(self.epd_socket, zmq.POLLIN)
        return bool(poller.poll(timeout_ms))

    def recv_requests(self) -> list:
        """Rank 0 drains the tokenizer's socket; every rank gets the same list (TP broadcast)."""
        msgs = []
        if self.recv_socket is not None:
            # only grammars compiling: wait for input a little, not a busy loop, nor a whole second
            only_compiling = not (self.waiting or self.running or self.chunked_req) and bool(self.grammar_queue)
            # requests waiting for embeddings, or embeddings waiting for requests: deadlines and expiries need checks
            held = self.epd_rendezvous is not None and self.epd_rendezvous.needs_ticks()
            if (self.is_idle() or only_compiling) and not self._input_ready(5 if only_compiling else 1000) \
                    and not held:
                return broadcast_pyobj([], self.tp)
            while True:
                try:
                    msgs.append(self.recv_socket.recv_pyobj(zmq.NOBLOCK))
                except zmq.ZMQError:
                    break
            if self.epd_rendezvous is not None:
                msgs = self._admit_epd(msgs)
        timing: dict = {}
        msgs = broadcast_pyobj(msgs, self.tp, timing=timing)
        wall_ms = timing["wall_ms"]
        self._unwrap_shm_features(msgs)
        for msg in msgs:
            if isinstance(msg, TokenizedGenerateReqInput):
                msg.tp_broadcast_ms = wall_ms  # the broadcast carrying this request (all of it)
        return msgs

    def _admit_epd(self, msgs: list) -> list:
        """Embeddings pushed by the encoders join this step's messages; one that fails a check of the wire
        format (garbage, truncated, oversized, a bad MAC) is logged and dropped alone."""
        from sglang.srt.disaggregation.encode_wire import decode_embedding_frames

        while self.epd_socket is not None:
            try:
                frames = self.epd_socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.ZMQError:
                break
            try:
                msgs.append(decode_embedding_frames(frames, *self.epd_limits))
            except ValueError as e:
                self.epd_rendezvous.dropped += 1
                logger.warning("dropped an embedding message: %s", e)
        return self.epd_rendezvous.admit(msgs, self._num_queued(), self.server_args.max_queued_requests)

    def _num_queued(self) -> int:
        """Requests waiting to run, grammars still compiling included: what --max-queued-requests bounds."""
        return len(self.waiting) + (len(self.grammar_queue.pending) if self.grammar_queue else 0)

    def _unwrap_shm_features(self, msgs: list) -> None:
        """Pixel data sent through shared memory is mapped only now, after the broadcast carried its
        metadata to every rank; once all ranks hold a mapping, rank 0 unlinks the names (once).
        With --mm-feature-transport cuda_ipc, pool pointers become tensors here too (each rank releases
        its own reads; items that fell back to shared memory follow the shm path below)."""
        if getattr(getattr(self, "server_args", None), "mm_feature_transport", None) == "cuda_ipc":
            materialize_ipc_features(msgs, self.tp.rank)
        names = materialize_mm_features(msgs)
        if not names:
            return
        if self.tp.size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.tp.cpu_group)
        if self.tp.rank == 0:
            unlink_segments(names)

    def process_input_requests(self, msgs: list) -> None:
        for msg in msgs:
            if isinstance(msg, TokenizedGenerateReqInput):
                self.handle_generate_request(msg)
            elif isinstance(msg, AbortReq):
                self.handle_abort(msg.rid, msg.reason)
            elif isinstance(msg, FlushCacheReq):
                out = self.flush_cache()
                out.req_id = msg.req_id
                self.send(out)
            elif isinstance(msg, GetServerInfoReq):
                self.send(GetServerInfoReqOutput(self.get_info(), req_id=msg.req_id))
            elif isinstance(msg, GetLoadReq):
                load = self.get_load()
                load.req_id = msg.req_id
                self.send(load)
            elif isinstance(msg, ProfileReq):
                self.handle_profile(msg)
            elif isinstance(msg, UpdateWeightFromDiskReqInput):
                self.handle_update_weights(msg)  # scheduler_update_weights_mixin.py
            else:
                logger.error("scheduler dropped an unknown message %r", type(msg).__name__)

    def handle_generate_request(self, recv: TokenizedGenerateReqInput) -> None:
        try:
            self._handle_generate_request(recv)
        except Exception as e:  # one malformed request must not end the loop
            logger.exception("request %s failed on arrival", recv.rid)
            req = Req(recv.rid, recv.input_ids or [0], recv.sampling_params, None, recv.stream, recv.created_time)
            self._fail(req, e)

    def _handle_generate_request(self, recv: TokenizedGenerateReqInput) -> None:
        self.num_received_reqs += 1
        self.num_received_tokens += len(recv.input_ids or ())
        req = Req(recv.rid, recv.input_ids, recv.sampling_params, recv.mm_inputs, recv.stream,
                  recv.created_time, recv.stage_timings_ms)
        req.tp_broadcast_ms = recv.tp_broadcast_ms
        req.priority = recv.priority
        req.grammar_start_after = recv.grammar_start_after
        req.custom_logit_processor = recv.custom_logit_processor
        req.upstream_stages = frozenset(recv.stage_timings_ms)
        if recv.epd_error:  # --language-only: its embeddings never reached rank 0, or the queue was full
            self.finish(req, FinishReason("abort", message=recv.epd_error, status_code=503))
            return
        if self.stage_timer.enabled:
            if recv.epd_wait_ms is not None:
                self.stage_timer.add(req.stage_timings_ms, "epd_wait", recv.epd_wait_ms)
            if recv.send_time:
                self.stage_timer.add(req.stage_timings_ms, "recv", (time.time() - recv.send_time) * 1e3)
            self.stage_timer.add(req.stage_timings_ms, "broadcast", recv.tp_broadcast_ms)
        error = self._validate(req)
        if error:
            self.finish(req, FinishReason("abort", message=error, status_code=400))
            return
        if not self._make_room(req):
            return
        if req.mm_inputs is not None and req.mm_inputs.mm_items:
            # Baseline (SGLANG_MM_PRECOMPUTE_HASH=0): every image is hashed here, in the scheduler loop.
            # Precomputed, the tokenizer timed `hash` itself and this only fills what is missing.
            if "hash" in req.upstream_stages:
                ensure_item_hashes(req.mm_inputs, self.hash_algo)
            else:
                with self.stage_timer.measure(req.stage_timings_ms, "hash"):
                    ensure_item_hashes(req.mm_inputs, self.hash_algo)
            req.prompt_key = pad_input_ids(req.origin_input_ids, req.mm_inputs)
        key = req.sampling_params.grammar_key()
        if key is not None:
            if self.grammar_queue is None:
                self.finish(req, FinishReason("abort", status_code=400, message=f"{key[0]} is not supported: this "
                                              "server runs with --grammar-backend none"))
            else:
                self.grammar_queue.add(req, key)  # joins the waiting queue once compiled on every rank
            return
        self.waiting.append(req)

    def _make_room(self, req: Req) -> bool:
        """--max-queued-requests: False (the request answered 503) when the queue is full, unless priority
        scheduling lets it displace the queued request of lowest priority (that one gets the 503)."""
        limit = self.server_args.max_queued_requests
        if limit is None or self._num_queued() < limit:
            return True
        if self.server_args.enable_priority_scheduling and self.waiting:
            sign = 1 if self.server_args.schedule_low_priority_values_first else -1
            # the queued request that would run last; the newest of equals goes first
            victim = max(reversed(self.waiting), key=lambda r: sign * r.priority)
            if sign * req.priority < sign * victim.priority:
                self.waiting.remove(victim)
                self.kv.release(victim)
                self.finish(victim, FinishReason("abort", message="The request is aborted by a higher priority "
                                                 "request.", status_code=503))
                return True
        self.finish(req, FinishReason("abort", message="The request queue is full.", status_code=503))
        return False

    def _validate(self, req: Req) -> str | None:
        """The request was validated where it entered (RequestBuilder: prompt, context length, images,
        sampling parameters). Here only the invariants this rank's own structures rely on: a non-empty
        prompt within the request table's width, and the KV budget the ranks agreed on."""
        n = req.prompt_len
        if n == 0:
            return "the prompt is empty"
        if n >= self.context_length:
            return f"the prompt has {n} tokens; the context length is {self.context_length}"
        if n + 1 > self.max_total_num_tokens:
            return f"the prompt needs {n + 1} KV slots; the KV cache holds {self.max_total_num_tokens}"
        max_new = req.sampling_params.max_new_tokens
        if n + max_new > self.max_total_num_tokens:
            return (f"the prompt ({n} tokens) plus max_new_tokens ({max_new}) need {n + max_new} KV slots; "
                    f"the KV cache holds {self.max_total_num_tokens}")
        return None

    def handle_abort(self, rid: str, reason: str) -> None:
        compiling = self.grammar_queue.remove(rid) if self.grammar_queue else None
        if compiling is not None:
            self.finish(compiling, FinishReason("abort", message=reason))
            return
        for i, req in enumerate(self.waiting):
            if req.rid == rid:
                del self.waiting[i]
                self.kv.release(req)
                self.finish(req, FinishReason("abort", message=reason))
                return
        for req in self.running + ([self.chunked_req] if self.chunked_req else []):
            if req.rid == rid:
                req.to_abort = FinishReason("abort", message=reason)  # applied between steps

    # ------------------------------------------------------------------ control
    def flush_cache(self) -> FlushCacheReqOutput:
        if not self.is_idle():
            return FlushCacheReqOutput(False, "requests are running; flush the cache when the server is idle")
        self.tree.reset()
        self.worker.clear_mm_cache()
        return FlushCacheReqOutput(True)

    def handle_profile(self, req: ProfileReq) -> None:
        """Every rank starts or stops its own profiler; rank 0 answers once all of them did (their
        traces are written when a stop is answered)."""
        if self._profiler is None:
            self._profiler = SchedulerProfiler(self.tp.rank)
        if self.report_dp_rank and req.profile_id:  # --dp-size > 1: every replica's ranks name their traces
            req = dataclasses.replace(req, profile_id=f"{req.profile_id}-DP-{self.dp_rank}")
        out = self._profiler.handle(req)
        if self.tp.size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.tp.cpu_group)
        out.req_id = req.req_id
        self.send(out)

    def get_load(self) -> GetLoadReqOutput:
        """This replica's load now (upstream's /get_load fields). Requests still compiling a grammar count
        as waiting: they hold no KV yet but will."""
        held = self.running + ([self.chunked_req] if self.chunked_req else [])
        waiting = self.waiting + ([r for r, _ in self.grammar_queue.pending] if self.grammar_queue else [])
        to_prefill = sum(r.prompt_len - r.kv_len for r in waiting)
        tokens = sum(r.kv_len for r in held) + to_prefill
        if self.chunked_req is not None:  # the rest of a prompt being prefilled in chunks
            to_prefill += max(self.chunked_req.prompt_len - self.chunked_req.kv_len, 0)
        return GetLoadReqOutput(dp_rank=self.dp_rank, num_reqs=len(held) + len(waiting),
                                num_waiting_reqs=len(waiting), num_tokens=tokens, num_pending_tokens=to_prefill,
                                ts_tic=time.perf_counter())

    def report_load(self) -> None:
        """Tells the data-parallel controller this replica's load, when it changed since the last report."""
        if self.load_socket is None:
            return
        load = self.get_load()
        report = (load.num_reqs, load.num_tokens, self.num_received_reqs, self.num_received_tokens)
        if report != self._last_load_report:
            self._last_load_report = report
            self.load_socket.send_pyobj(ReplicaLoadReport(self.dp_rank, *report))

    def get_info(self) -> dict:
        return {
            "dp_rank": self.dp_rank,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "available_kv_tokens": self.kv.available_tokens(),
            "free_kv_tokens": self.kv.allocator.available_size(),
            "radix_cache_tokens": self.tree.total_size(),
            "num_running_reqs": len(self.running) + (1 if self.chunked_req else 0),
            "num_waiting_reqs": len(self.waiting),
            "free_req_slots": self.kv.req_to_token_pool.available_size(),
            "num_retractions": self.num_retractions,
            "new_token_ratio": round(self.new_token_ratio.value, 4),
            "num_request_errors": self.num_request_errors,
            "overlap_schedule": self.enable_overlap,
            "context_length": self.context_length,
            "chunked_prefill_size": self.chunked_prefill_size,  # after the start-up activation check
            **self.worker.mm_stats(),
            **ipc_receiver_stats(),
            "image_decode_model": deferred_decode.stats(),  # images decoded where the ViT runs, by path
            # this rank's compiled grammars, and the requests waiting for theirs (no KV held)
            "grammar_cache": self.grammar_queue.cache.stats() if self.grammar_queue is not None else None,
            "num_grammar_queue_reqs": len(self.grammar_queue) if self.grammar_queue is not None else 0,
            **self._path_info(),
        }

    def _path_info(self) -> dict:
        """What actually ran (counters and facts read from the objects doing the work, not settings):
        this rank's under "paths", every TP rank's model paths under "tp_rank_paths" (each rank answers
        the same GetServerInfoReq in the same order, so the gather lines up). docs/observability.md"""
        model_paths = self.worker.path_stats()
        return {"paths": {**model_paths,
                          "grammar_compiles": dict(self.grammar_queue.compiles) if self.grammar_queue is not None else {},
                          "overlap_steps_launched": getattr(self, "num_overlap_launches", 0),
                          "hybrid_prefix": self.kv.hybrid.stats() if self.kv.hybrid is not None else None},
                "tp_rank_paths": all_gather_pyobj(model_paths, self.tp)}
