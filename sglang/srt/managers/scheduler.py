"""The scheduler process of one TP rank: receives requests (rank 0 from the tokenizer manager,
broadcast to the other ranks), forms prefill / decode batches, runs them, and streams token ids
to the detokenizer. The loop itself is small; policy and KV bookkeeping live in their own files."""

from __future__ import annotations

import logging
import sys
import time
import traceback

import torch
import zmq

from sglang.srt.distributed.communication_op import broadcast_pyobj
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo, init_tp_group
from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenIDOut,
    FinishReason,
    FlushCacheReq,
    FlushCacheReqOutput,
    GetServerInfoReq,
    GetServerInfoReqOutput,
    SchedulerDied,
    SchedulerReady,
    TokenizedGenerateReqInput,
)
from sglang.srt.managers.mm_utils import pad_input_ids
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import NewTokenRatio, PrefillAdder, order_waiting, pick_retract_victim
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.mem_cache.cache_manager import KVCacheManager, OutOfKVSlots
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.multimodal.hashing import ensure_item_hashes
from sglang.srt.multimodal.transport.shm import materialize_mm_features, unlink_segments
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.vlm_stage_timer import STAGES, VlmStageTimer, rounded, stage_timer_enabled

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs | None, tp: TPInfo = SINGLE_RANK, gpu_id: int = 0):
        self.server_args = server_args
        self.tp = tp
        model_path = server_args.resolved_model_path()
        self.worker = TpModelWorker(server_args, model_path, tp, gpu_id)
        runner = self.worker.model_runner
        self.model_config = runner.model_config
        self.context_length = runner.context_length
        if tp.size > 1:
            runner.shrink_kv_budget(_min_across_ranks(runner.max_total_num_tokens, tp))
        self.max_total_num_tokens = runner.max_total_num_tokens
        self.tree = RadixCache(runner.allocator, server_args.page_size, disable=server_args.disable_radix_cache)
        self.kv = KVCacheManager(runner.req_to_token_pool, runner.allocator, self.tree)
        self.eos_ids = set(self.model_config.eos_token_ids)
        self.stage_timer = VlmStageTimer(stage_timer_enabled(server_args), tp.rank)
        self._tokenizer = None
        self._tokenizer_path = server_args.tokenizer_path or model_path

        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.outbox: list[Req] = []  # requests with tokens (or a finish) to send this step
        self.num_retractions = 0
        self.num_request_errors = 0  # requests ended by an exception in their own processing
        self.new_token_ratio = NewTokenRatio(server_args.schedule_conservativeness)

        self.recv_socket = self.send_socket = None
        if port_args is not None and tp.rank == 0:
            ctx = zmq.Context(1)
            self.recv_socket = ctx.socket(zmq.PULL)
            self.recv_socket.bind(port_args.scheduler_input_ipc_name)
            self.send_socket = ctx.socket(zmq.PUSH)
            self.send_socket.connect(port_args.detokenizer_ipc_name)

    # ------------------------------------------------------------------ input
    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_path)
        return self._tokenizer

    def is_idle(self) -> bool:
        return not (self.waiting or self.running or self.chunked_req)

    def recv_requests(self) -> list:
        """Rank 0 drains the tokenizer's socket; every rank gets the same list (TP broadcast)."""
        msgs = []
        if self.recv_socket is not None:
            if self.is_idle() and not self.recv_socket.poll(timeout=1000):
                return broadcast_pyobj([], self.tp)
            while True:
                try:
                    msgs.append(self.recv_socket.recv_pyobj(zmq.NOBLOCK))
                except zmq.ZMQError:
                    break
        timing: dict = {}
        msgs = broadcast_pyobj(msgs, self.tp, timing=timing)
        wall_ms = timing["wall_ms"]
        self._unwrap_shm_features(msgs)
        for msg in msgs:
            if isinstance(msg, TokenizedGenerateReqInput):
                msg.tp_broadcast_ms = wall_ms  # the broadcast carrying this request (all of it)
        return msgs

    def _unwrap_shm_features(self, msgs: list) -> None:
        """Pixel data sent through shared memory is mapped only now, after the broadcast carried its
        metadata to every rank; once all ranks hold a mapping, rank 0 unlinks the names (once)."""
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
        req = Req(recv.rid, recv.input_ids, recv.sampling_params, recv.mm_inputs, recv.stream,
                  recv.created_time, recv.stage_timings_ms)
        req.tp_broadcast_ms = recv.tp_broadcast_ms
        req.upstream_stages = frozenset(recv.stage_timings_ms)
        if self.stage_timer.enabled:
            if recv.send_time:
                self.stage_timer.add(req.stage_timings_ms, "recv", (time.time() - recv.send_time) * 1e3)
            self.stage_timer.add(req.stage_timings_ms, "broadcast", recv.tp_broadcast_ms)
        error = self._validate(req)
        if error:
            self.finish(req, FinishReason("abort", message=error, status_code=400))
            return
        if req.mm_inputs is not None and req.mm_inputs.mm_items:
            # Baseline (SGLANG_MM_PRECOMPUTE_HASH=0): every image is hashed here, in the scheduler loop.
            # Precomputed, the tokenizer timed `hash` itself and this only fills what is missing.
            if "hash" in req.upstream_stages:
                ensure_item_hashes(req.mm_inputs)
            else:
                with self.stage_timer.measure(req.stage_timings_ms, "hash"):
                    ensure_item_hashes(req.mm_inputs)
            req.prompt_key = pad_input_ids(req.origin_input_ids, req.mm_inputs)
        self.waiting.append(req)

    def _validate(self, req: Req) -> str | None:
        n = req.prompt_len
        if n == 0:
            return "the prompt is empty"
        if n >= self.context_length:
            return f"the prompt has {n} tokens; the context length is {self.context_length}"
        if n + 1 > self.max_total_num_tokens:
            return f"the prompt needs {n + 1} KV slots; the KV cache holds {self.max_total_num_tokens}"
        max_new = req.sampling_params.max_new_tokens
        if isinstance(max_new, int) and n + max_new > self.max_total_num_tokens:
            return (f"the prompt ({n} tokens) plus max_new_tokens ({max_new}) need {n + max_new} KV slots; "
                    f"the KV cache holds {self.max_total_num_tokens}")
        items = req.mm_inputs.mm_items if req.mm_inputs is not None else []
        if len(items) > self.server_args.limit_mm_per_prompt:
            return f"{len(items)} images exceed --limit-mm-per-prompt {self.server_args.limit_mm_per_prompt}"
        try:
            req.sampling_params.verify()
        except ValueError as e:
            return str(e)
        return None

    def handle_abort(self, rid: str, reason: str) -> None:
        for i, req in enumerate(self.waiting):
            if req.rid == rid:
                del self.waiting[i]
                self.kv.release(req)
                self.finish(req, FinishReason("abort", message=reason))
                return
        for req in self.running + ([self.chunked_req] if self.chunked_req else []):
            if req.rid == rid:
                req.to_abort = FinishReason("abort", message=reason)  # applied between steps

    # ------------------------------------------------------------------ scheduling
    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        self._apply_aborts()
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return batch
        return self.update_running_batch()

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        args = self.server_args
        chunking = args.chunked_prefill_size > 0
        step = args.chunked_prefill_size if chunking else args.max_prefill_tokens
        adder = PrefillAdder(self.kv, self.running, step, args.max_running_requests, chunking,
                             self.new_token_ratio.value)
        if self.chunked_req is not None:
            adder.free_running += 1  # the chunked request's slot is already its own
            if not adder.add(self.chunked_req):
                return None
        candidates = order_waiting(self.waiting, args.schedule_policy, self.kv)
        for req in candidates:
            if not adder.add(req):
                break
        if not adder.reqs:
            return None
        reqs, lens, locs = [], [], []
        for req, n in zip(adder.reqs, adder.extend_lens):
            if n == 0:  # a retracted request whose whole history is cached: straight back to decode
                self._take_from_waiting(req)
                self.running.append(req)
                continue
            try:
                locs.append(self.kv.extend(req, n))
            except OutOfKVSlots:
                # the estimate was optimistic (pages, eviction): this and later requests wait
                for later in adder.reqs[adder.reqs.index(req):]:
                    if later is not self.chunked_req and later.kv_len == later.cache_len:
                        self.kv.release(later)
                break
            self._take_from_waiting(req)
            reqs.append(req)
            lens.append(n)
        if not reqs:
            return None
        batch = ScheduleBatch(ForwardMode.EXTEND, reqs, extend_lens=lens,
                              prefix_lens=[r.kv_len - n for r, n in zip(reqs, lens)])
        batch.out_cache_loc = torch.cat(locs)
        return batch

    def _take_from_waiting(self, req: Req) -> None:
        if req is not self.chunked_req:
            self.waiting.remove(req)

    def update_running_batch(self) -> ScheduleBatch | None:
        if not self.running:
            return None
        ps = self.kv.allocator.page_size
        while self.kv.available_tokens() < ps * sum(r.kv_len % ps == 0 for r in self.running):
            if self.chunked_req is not None:  # pause the prefill first: decoding requests keep going
                req, self.chunked_req = self.chunked_req, None
                self._retract(req)
            elif len(self.running) > 1:
                victim = pick_retract_victim(self.running)
                self.running.remove(victim)
                self._retract(victim)
            else:  # validation keeps prompt + max_new_tokens within the KV cache: cannot happen
                req = self.running.pop()
                logger.error("KV cache exhausted by a single request %s; ending it", req.rid)
                self.finish(req, FinishReason("length", message="the KV cache is full"))
                return None
        self.new_token_ratio.on_decode_step()
        locs = [self.kv.extend(r, 1) for r in self.running]
        batch = ScheduleBatch(ForwardMode.DECODE, list(self.running))
        batch.out_cache_loc = torch.cat(locs)
        return batch

    def _retract(self, req: Req) -> None:
        """Out of KV for decoding: free this request's KV (its prefix goes to the radix cache) and
        requeue it at the front; it re-prefills prompt + outputs later, output so far intact."""
        self.kv.release(req)
        self.waiting.insert(0, req)
        self.num_retractions += 1
        self.new_token_ratio.on_retract(self.running)
        logger.warning("KV cache full: retracted %s (%d retractions so far; new-token ratio now %.2f)",
                       req.rid, self.num_retractions, self.new_token_ratio.value)

    def _apply_aborts(self) -> None:
        for req in [r for r in self.running if r.to_abort]:
            self.running.remove(req)
            self.finish(req, req.to_abort)
        if self.chunked_req is not None and self.chunked_req.to_abort:
            req, self.chunked_req = self.chunked_req, None
            self.finish(req, req.to_abort)

    # ------------------------------------------------------------------ results
    def run_batch(self, batch: ScheduleBatch) -> None:
        timer = self.stage_timer
        start = time.perf_counter()
        next_ids, totals = self.worker.forward_batch_generation(batch, timer.enabled)
        now = time.perf_counter()
        if timer.enabled:
            step_ms = (now - start) * 1e3
            if batch.mode.is_extend():
                step_ms -= totals.get("vit_encode", 0.0) + totals.get("embed_merge", 0.0)
            for r in batch.reqs:
                timer.add(r.stage_timings_ms, "llm_prefill" if batch.mode.is_extend() else "decode", step_ms)
        if batch.mode.is_extend():
            if self.chunked_req is not None and any(r is self.chunked_req for r in batch.reqs):
                self.chunked_req = None
            for req, tok in zip(batch.reqs, next_ids):
                if req.is_prefilling():
                    self.chunked_req = req
                    continue
                if req.output_ids:  # re-prefill after retraction: its next token is already known
                    self.running.append(req)
                    continue
                timer.add(req.stage_timings_ms, "first_token", (time.time() - req.created_time) * 1e3)
                self._append_token(req, tok)
                if not req.finished():
                    self.running.append(req)
        else:
            for req, tok in zip(batch.reqs, next_ids):
                self._append_token(req, tok)
            self.running = [r for r in self.running if not r.finished()]

    def _append_token(self, req: Req, tok: int) -> None:
        req.output_ids.append(tok)
        try:
            reason = self._check_finished(req, tok)
        except Exception as e:  # e.g. a tokenizer failure while matching stop strings
            logger.exception("request %s failed while checking its stop conditions", req.rid)
            self.running = [r for r in self.running if r is not req]
            self._fail(req, e)
            return
        if reason is not None:
            self.finish(req, reason)
        elif req.stream and len(req.output_ids) - req.sent_len >= self.server_args.stream_interval:
            self.outbox.append(req)

    def _check_finished(self, req: Req, tok: int) -> FinishReason | None:
        sp = req.sampling_params
        if tok in self.eos_ids and not sp.ignore_eos:
            return FinishReason("stop", matched=tok)
        if tok in sp.stop_token_ids:
            return FinishReason("stop", matched=tok)
        if sp.stop:
            tail = self.tokenizer.decode(req.output_ids[-(8 + max(len(s) for s in sp.stop)) :])
            for s in sp.stop:
                if s in tail:
                    return FinishReason("stop", matched=s)
        if len(req.output_ids) >= sp.max_new_tokens:
            return FinishReason("length")
        if req.prompt_len + len(req.output_ids) >= self.context_length:
            return FinishReason("length")
        return None

    def _fail(self, req: Req, error: BaseException) -> None:
        """Ends one request with a server error; its KV is released and the others go on."""
        self.num_request_errors += 1
        if req.finished():
            return
        msg = f"internal error while processing this request: {type(error).__name__}: {error}"
        self.finish(req, FinishReason("abort", message=msg, status_code=500))

    def _fail_batch(self, batch: ScheduleBatch, error: BaseException) -> None:
        """A forward failed: nobody can tell which request caused it, so every request of the batch
        ends with the error; requests not in the batch are untouched."""
        in_batch = {id(r) for r in batch.reqs}
        self.running = [r for r in self.running if id(r) not in in_batch]
        if self.chunked_req is not None and id(self.chunked_req) in in_batch:
            self.chunked_req = None
        for req in batch.reqs:
            self._fail(req, error)

    def finish(self, req: Req, reason: FinishReason) -> None:
        req.finished_reason = reason
        # stages measured upstream (tokenizer process) were logged there
        self.stage_timer.emit(req.rid, req.stage_timings_ms, [st for st in STAGES if st not in req.upstream_stages])
        self.kv.release(req)
        self.outbox.append(req)

    def flush_outputs(self) -> None:
        if not self.outbox or self.tp.rank != 0:
            self.outbox.clear()
            return
        seen, reqs = set(), []
        for r in self.outbox:
            if id(r) not in seen:
                seen.add(id(r))
                reqs.append(r)
        self.outbox.clear()
        out = BatchTokenIDOut([], [], [], [], [], [], [], [])
        for r in reqs:
            out.rids.append(r.rid)
            out.new_token_ids.append(r.output_ids[r.sent_len :])
            r.sent_len = len(r.output_ids)
            out.finished_reasons.append(r.finished_reason)
            out.prompt_tokens.append(r.prompt_len)
            out.completion_tokens.append(len(r.output_ids))
            out.cached_tokens.append(r.cached_tokens)
            out.skip_special_tokens.append(r.sampling_params.skip_special_tokens)
            out.meta_info.append(self._meta_info(r))
        self.send(out)

    def _meta_info(self, req: Req) -> dict:
        meta = {"prompt_tokens": req.prompt_len, "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_tokens, "tp_broadcast_ms": round(req.tp_broadcast_ms, 3)}
        if req.mm_inputs is not None:
            meta["vit_encoded_images"] = req.mm_inputs.num_vit_encoded
        if req.stage_timings_ms:
            meta["stage_timings_ms"] = rounded(req.stage_timings_ms)
        return meta

    def send(self, obj) -> None:
        if self.send_socket is not None:
            self.send_socket.send_pyobj(obj)

    # ------------------------------------------------------------------ control
    def flush_cache(self) -> FlushCacheReqOutput:
        if not self.is_idle():
            return FlushCacheReqOutput(False, "requests are running; flush the cache when the server is idle")
        self.tree.reset()
        self.worker.model_runner.mm_embedding_cache.clear()
        return FlushCacheReqOutput(True)

    def get_info(self) -> dict:
        return {
            "max_total_num_tokens": self.max_total_num_tokens,
            "available_kv_tokens": self.kv.available_tokens(),
            "free_kv_tokens": self.kv.allocator.available_size(),
            "radix_cache_tokens": self.tree.total_size(),
            "num_running_reqs": len(self.running) + (1 if self.chunked_req else 0),
            "num_waiting_reqs": len(self.waiting),
            "free_req_slots": self.kv.req_to_token_pool.available_size(),
            "num_retractions": self.num_retractions,
            "new_token_ratio": round(self.new_token_ratio.value, 4),
            "num_request_errors": self.num_request_errors,
            "context_length": self.context_length,
            "mm_embedding_cache_bytes": self.worker.model_runner.mm_embedding_cache.current_bytes,
            "mm_embedding_cache_hits": self.worker.model_runner.mm_embedding_cache.hits,
            "mm_embedding_cache_misses": self.worker.model_runner.mm_embedding_cache.misses,
        }

    # ------------------------------------------------------------------ loop
    def step(self) -> bool:
        """One scheduling step; returns whether a batch ran."""
        self.process_input_requests(self.recv_requests())
        batch = self.get_next_batch_to_run()
        if batch is not None:
            try:
                self.run_batch(batch)
            except Exception as e:
                if _is_engine_fault(e):
                    raise
                logger.exception("a %s batch of %d request(s) failed", batch.mode.name, len(batch.reqs))
                self._fail_batch(batch, e)
        self.flush_outputs()
        return batch is not None

    def event_loop(self) -> None:
        while True:
            try:
                self.step()
            except Exception as e:
                if _is_engine_fault(e):
                    raise
                # a scheduling bug, not a dead peer: end what is in flight with an error, keep serving
                logger.exception("scheduler step failed; ending the requests in flight with an error")
                self._fail_all(e)

    def _fail_all(self, error: BaseException) -> None:
        reqs = self.running + ([self.chunked_req] if self.chunked_req else []) + self.waiting
        self.running, self.chunked_req, self.waiting = [], None, []
        for req in reqs:
            self._fail(req, error)
        self.flush_outputs()


def _is_engine_fault(e: BaseException) -> bool:
    """Failures no request caused and none can survive: a collective with a dead peer rank, a lost
    device. The process exits on these (the server answers 503 and stops)."""
    import torch.distributed as dist

    if isinstance(e, getattr(dist, "DistError", ())) or isinstance(e, (MemoryError, SystemError)):
        return True
    text = str(e)
    return any(s in text for s in ("Connection closed by peer", "Gloo", "NCCL", "CUDA error", "device-side assert"))


def _min_across_ranks(value: int, tp: TPInfo) -> int:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.cpu_group)
    return int(t.item())


def run_scheduler_process(server_args: ServerArgs, port_args: PortArgs, tp_rank: int, ready_writer) -> None:
    """Scheduler process body (the engine's child wrapper sets up logging, SIGINT and parent watch)."""
    torch.manual_seed(server_args.random_seed)
    try:
        ranks_per_node = server_args.tp_size // server_args.nnodes
        gpu_id = tp_rank % ranks_per_node
        device = server_args.resolved_device()
        if device == "cuda":
            torch.cuda.set_device(gpu_id)
        tp = init_tp_group(
            server_args.tp_size,
            tp_rank,
            server_args.dist_init_addr or f"127.0.0.1:{port_args.nccl_port}",
            "nccl" if device == "cuda" else "gloo",
            server_args.watchdog_timeout,
        )
        scheduler = Scheduler(server_args, port_args, tp, gpu_id)
        ready_writer.send(SchedulerReady(scheduler.max_total_num_tokens, scheduler.context_length - 1,
                                         scheduler.context_length))
    except Exception as e:
        traceback.print_exc()
        ready_writer.send(SchedulerDied(f"scheduler failed to start: {type(e).__name__}: {e}"))
        sys.exit(1)
    try:
        scheduler.event_loop()
    except Exception:
        logger.error("scheduler crashed:\n%s", traceback.format_exc())
        sys.exit(1)
