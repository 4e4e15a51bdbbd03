"""The scheduler process of one TP rank: receives requests (rank 0 from the tokenizer manager,
broadcast to the other ranks), forms prefill / decode batches, runs them, and streams token ids
to the detokenizer. The loop itself is small; policy and KV bookkeeping live in their own files."""

from __future__ import annotations

import logging
import random
import sys
import traceback
from operator import attrgetter

import torch
import zmq

from sglang.srt.constrained.scheduler_grammar import GrammarQueue
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo, init_tp_group
from sglang.srt.environ import envs
from sglang.srt.errors import ServeRefusal
from sglang.srt.managers.io_struct import FinishReason, SchedulerDied, SchedulerReady
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch, append_decode_slots, kv_lens, req_pool_indices
from sglang.srt.managers.schedule_policy import (
    NewTokenRatio,
    PrefillAdder,
    order_waiting,
    pick_retract_victim,
    preemption_victims,
)
from sglang.srt.managers.scheduler_io_mixin import SchedulerIOMixin
from sglang.srt.managers.scheduler_output_processor_mixin import SchedulerOutputProcessorMixin
from sglang.srt.managers.scheduler_overlap_mixin import SchedulerOverlapMixin, _is_engine_fault
from sglang.srt.managers.scheduler_update_weights_mixin import SchedulerUpdateWeightsMixin
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.mem_cache.cache_manager import KVCacheManager, OutOfKVSlots
from sglang.srt.mem_cache.hybrid_prefix import HybridPrefixTracker
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.memory_budget import available_bytes, fit_chunk, prefill_activation_bytes
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.multimodal.hashing import configured_hash_algo
from sglang.srt.server_args import PortArgs, ServerArgs, derive_max_running_requests
from sglang.srt.metrics.stage_timer import VlmStageTimer, stage_timer_enabled

logger = logging.getLogger(__name__)
_TO_ABORT = attrgetter("to_abort")


class Scheduler(SchedulerIOMixin, SchedulerOutputProcessorMixin, SchedulerUpdateWeightsMixin, SchedulerOverlapMixin):
    """One TP rank's scheduler: the loop and the batch decisions live here; receiving requests is in
    `scheduler_io_mixin.py`, applying results and sending them in `scheduler_output_processor_mixin.py`,
    the overlapped loop in `scheduler_overlap_mixin.py`."""

    def __init__(self, server_args: ServerArgs, port_args: PortArgs | None, tp: TPInfo = SINGLE_RANK, gpu_id: int = 0,
                 dp_rank: int = 0):
        self.server_args = server_args
        self.tp = tp
        self.dp_rank = dp_rank  # which data-parallel replica this TP group is (--dp-size)
        model_path = server_args.resolved_model_path()
        self.worker = TpModelWorker(server_args, model_path, tp, gpu_id, dp_rank)
        runner = self.worker.model_runner
        self.model_config = runner.model_config
        self.context_length = runner.context_length
        if tp.size > 1:
            runner.shrink_kv_budget(_min_across_ranks(runner.max_total_num_tokens, tp))
        self.max_total_num_tokens = runner.max_total_num_tokens
        # from the budget every rank agreed on, so the ranks' batch decisions stay identical
        self.max_running_requests = min(
            server_args.max_running_requests or derive_max_running_requests(self.max_total_num_tokens, self.context_length),
            runner.req_to_token_pool.size - 1,
        )
        # the chunk every rank agreed fits its activations next to the KV cache
        self.chunked_prefill_size = self._fit_prefill_chunk(runner, server_args)
        pool = runner.state_pool  # hybrid models: cached prefixes resume from recurrent-state snapshots
        self.tree = RadixCache(runner.allocator, server_args.page_size, disable=server_args.disable_radix_cache,
                               free_snapshot=pool.free_snapshot if pool is not None else None)
        hybrid = HybridPrefixTracker(pool, self.tree, server_args.mamba_track_interval) if pool is not None else None
        self.kv = KVCacheManager(runner.req_to_token_pool, runner.allocator, self.tree, hybrid)
        self.eos_ids = set(self.model_config.eos_token_ids)
        self.stage_timer = VlmStageTimer(stage_timer_enabled(server_args), tp.rank,
                                         dp_rank if server_args.dp_size > 1 else None)
        self.report_dp_rank = server_args.dp_size > 1  # outputs name their replica (meta_info["dp_rank"])
        self._tokenizer = None
        self._tokenizer_path = server_args.tokenizer_path or model_path

        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.outbox: list[Req] = []  # requests with tokens (or a finish) to send this step
        self.num_retractions = 0
        self.num_preemptions = 0  # running requests put back for a higher-priority one
        self.policy_rng = random.Random(server_args.random_seed)  # --schedule-policy random: alike on every rank
        self.num_request_errors = 0  # requests ended by an exception in their own processing
        self.new_token_ratio = NewTokenRatio(server_args.schedule_conservativeness)
        self.hash_algo = configured_hash_algo()  # resolved once; items the tokenizer did not hash use it
        # constrained requests wait here (no KV held) while their grammar compiles; None: --grammar-backend none
        self.grammar_queue = None
        if server_args.grammar_backend != "none":
            # the scheduler's tokenizer, loaded once per process by whichever needs it first (stop strings,
            # or the grammar compile thread building xgrammar's vocabulary view)
            self.grammar_queue = GrammarQueue(server_args, lambda: self.tokenizer, self.worker.vocab_size,
                                              self.eos_ids, tp)

        # on a CPU the forward thread would compete with this one for the same cores (docs/optimizations/overlap-schedule.md)
        self.init_overlap(not server_args.disable_overlap_schedule
                          and (runner.device.type == "cuda" or envs.SGLANG_OVERLAP_SCHEDULE_ON_CPU.get()))

        self.recv_socket = self.send_socket = self.load_socket = None
        if port_args is not None and tp.rank == 0:
            ctx = zmq.Context(1)
            self.recv_socket = ctx.socket(zmq.PULL)
            self.recv_socket.bind(port_args.scheduler_input_ipc_name)
            self.send_socket = ctx.socket(zmq.PUSH)
            self.send_socket.connect(port_args.detokenizer_ipc_name)
            if port_args.dp_load_ipc_name:  # --dp-size > 1: live counts for the data-parallel controller
                self.load_socket = ctx.socket(zmq.PUSH)
                self.load_socket.connect(port_args.dp_load_ipc_name)
            self.init_epd_receiver(server_args, port_args, ctx)  # --language-only: embeddings from encoders

    # ------------------------------------------------------------------ scheduling
    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        self._apply_aborts()
        self._admit_compiled_grammars()
        batch = self.get_new_batch_prefill()
        if batch is not None:
            return batch
        return self.update_running_batch()

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        if not self.waiting and self.chunked_req is None:
            # nothing to admit: no batch, and no admission budget to compute (a pass over every running
            # request's decode reserve at every decode step); nothing below has a side effect without candidates
            return None
        args = self.server_args
        if self._launched and self.waiting and args.enable_priority_scheduling and not args.disable_priority_preemption:
            self.resolve_in_flight()  # preemption takes KV back from running requests: decide on applied state
        chunking = self.chunked_prefill_size > 0
        step = self.chunked_prefill_size if chunking else args.max_prefill_tokens
        adder = PrefillAdder(self.kv, self.running, step, self.max_running_requests, chunking,
                             self.new_token_ratio.value)
        if self.chunked_req is not None:
            adder.free_running += 1  # the chunked request's slot is already its own
            if not adder.add(self.chunked_req):
                return None
        candidates = order_waiting(self.waiting, args.schedule_policy, self.kv, args.enable_priority_scheduling,
                                   args.schedule_low_priority_values_first, self.policy_rng)
        for req in candidates:
            if not adder.add(req) and not self._preempt_for(req, adder):
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
        if self.kv.hybrid is not None:
            batch.gdn_captures = self.kv.hybrid.plan_captures(reqs, batch.prefix_lens, lens)
        return batch

    def _admit_compiled_grammars(self) -> None:
        """Constrained requests whose grammar is ready on every rank join the waiting queue; one that failed
        to compile on any rank (invalid, empty language, past the time limit: the compile here is the
        grammar's only check) ends with a 400 naming the problem, or a 500 when the backend itself failed.
        Only TP rank 0 sends outputs, so the client gets the answer once; other requests are untouched."""
        if not self.grammar_queue:
            return
        ready, failed = self.grammar_queue.pop_ready()
        self.waiting.extend(ready)
        for req, message, status in failed:
            self.finish(req, FinishReason("abort", message=message, status_code=status))

    def _fit_prefill_chunk(self, runner, args: ServerArgs) -> int:
        """--chunked-prefill-size, shrunk (one warning) to what one chunk's activations need beside the KV
        cache, or a start-up error when not even the smallest chunk fits. On CPU the KV pool's pages may
        not be resident yet: its whole size is taken off the host's available memory."""
        chunk = args.chunked_prefill_size
        if chunk <= 0:
            return chunk
        text, itemsize = self.model_config.text, runner.dtype.itemsize
        available = available_bytes(runner.device)
        if runner.device.type != "cuda":
            pool = runner.token_to_kv_pool
            available -= pool.bytes_per_token() * (pool.size + 1)
        size, line = fit_chunk(chunk, lambda n: prefill_activation_bytes(
            text, n, self.context_length, itemsize, self.tp.size), max(0, available))
        if self.tp.size > 1:
            size = _min_across_ranks(size, self.tp)
        if line and self.tp.rank == 0:
            logger.warning(line)
        return size

    def _take_from_waiting(self, req: Req) -> None:
        if req is not self.chunked_req:
            self.waiting.remove(req)

    def update_running_batch(self) -> ScheduleBatch | None:
        if not self.running:
            return None
        while self.kv.available_tokens() < self._decode_slots_needed():
            if self._launched:  # the step in flight may end requests and free KV: retract only on applied state
                self.resolve_in_flight()
                if not self.running:
                    return None
                continue
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
        batch = ScheduleBatch(ForwardMode.DECODE, list(self.running))
        batch.out_cache_loc = self._extend_decode(self.running)
        return batch

    def _extend_decode(self, reqs: list[Req]) -> torch.Tensor:
        """Each request's KV slot for its next token. One-token pages: rows and columns read and the slots
        appended with C-level maps, one allocation and one table write for the batch."""
        if self.kv.allocator.page_size != 1:
            return self.kv.extend_decode(reqs)
        locs = self.kv.alloc_decode(req_pool_indices(reqs), kv_lens(reqs))
        append_decode_slots(reqs, locs.tolist())
        return locs

    def _decode_slots_needed(self) -> int:
        """KV slots the next decode step allocates: a new page for each running request whose last page is
        full; with pages of one token, one slot per request (kv_len % 1 == 0 always)."""
        ps = self.kv.allocator.page_size
        if ps == 1:
            return len(self.running)
        return ps * sum(r.kv_len % ps == 0 for r in self.running)

    def _retract(self, req: Req) -> None:
        """Out of KV for decoding: free this request's KV (its prefix goes to the radix cache) and
        requeue it at the front; it re-prefills prompt + outputs later, output so far intact."""
        self.release_kv(req)
        self.worker.forget_retracted(req.rid)  # its penalty row is rebuilt at the re-prefill
        self.waiting.insert(0, req)
        self.num_retractions += 1
        self.new_token_ratio.on_retract(self.running)
        logger.warning("KV cache full: retracted %s (%d retractions so far; new-token ratio now %.2f)",
                       req.rid, self.num_retractions, self.new_token_ratio.value)

    def _preempt_for(self, req: Req, adder: PrefillAdder) -> bool:
        """Priority scheduling: `req` found no request slot or KV room; running requests of a priority lower
        by --priority-scheduling-preemption-threshold go back to the queue (their output kept, their KV to
        the prefix cache) until it fits. Whether `req` was admitted."""
        args = self.server_args
        if not args.enable_priority_scheduling or args.disable_priority_preemption or adder.blocked_by == "step":
            return False
        for victim in preemption_victims(self.running, req, args.priority_scheduling_preemption_threshold,
                                         args.schedule_low_priority_values_first):
            self.running.remove(victim)
            adder.release_running(victim)
            self.release_kv(victim)
            self.worker.forget_retracted(victim.rid)  # its penalty row is rebuilt at the re-prefill
            self.waiting.append(victim)
            self.num_preemptions += 1
            logger.info("preempted %s (priority %d) for %s (priority %d)", victim.rid, victim.priority, req.rid,
                        req.priority)
            if adder.add(req):
                return True
        return False

    def _apply_aborts(self) -> None:
        if any(map(_TO_ABORT, self.running)):  # a scan in C: a decode step usually has nothing to abort
            for req in [r for r in self.running if r.to_abort]:
                self.running.remove(req)
                self.finish(req, req.to_abort)
        if self.chunked_req is not None and self.chunked_req.to_abort:
            req, self.chunked_req = self.chunked_req, None
            self.finish(req, req.to_abort)

    # ------------------------------------------------------------------ loop
    def step(self) -> bool:
        """One scheduling step; returns whether a batch ran (overlapped: was launched or applied)."""
        if self.enable_overlap:
            return self.step_overlap()
        self.process_input_requests(self.recv_requests())
        batch = self.get_next_batch_to_run()
        if batch is not None:
            try:
                self.run_batch(batch)
            except Exception as e:
                self.batch_failed(batch, e)
        # before the outputs leave: a client that saw its request finish is routed by a load that knows it
        self.report_load()
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
        reqs += self.grammar_queue.drain() if self.grammar_queue else []
        self.running, self.chunked_req, self.waiting = [], None, []
        for req in reqs:
            self._fail(req, error)
        self.flush_outputs()


def _min_across_ranks(value: int, tp: TPInfo) -> int:
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=tp.cpu_group)
    return int(t.item())


def run_scheduler_process(server_args: ServerArgs, port_args: PortArgs, tp_rank: int, ready_writer,
                          dp_rank: int = 0) -> None:
    """Scheduler process body (the engine's child wrapper sets up logging, SIGINT and parent watch).
    `port_args` are the replica's own at --dp-size > 1 (PortArgs.for_replica)."""
    torch.manual_seed(server_args.random_seed)
    try:
        ranks_per_node = server_args.tp_size // server_args.nnodes
        # replicas take consecutive blocks of devices from --base-gpu-id
        gpu_id = server_args.base_gpu_id + dp_rank * ranks_per_node + tp_rank % ranks_per_node
        device = server_args.resolved_device()
        if device == "cuda":
            torch.cuda.set_device(gpu_id)
        tp = init_tp_group(
            server_args.tp_size,
            tp_rank,
            _rendezvous(server_args, port_args, dp_rank),
            "nccl" if device == "cuda" else "gloo",
            server_args.watchdog_timeout,
            server_args.ep_size,
        )
        scheduler = Scheduler(server_args, port_args, tp, gpu_id, dp_rank)
        ready_writer.send(SchedulerReady(scheduler.max_total_num_tokens, scheduler.context_length - 1,
                                         scheduler.context_length))
    except Exception as e:
        if not isinstance(e, ServeRefusal):  # a refusal's message is the whole story; anything else is a bug
            traceback.print_exc()
        ready_writer.send(SchedulerDied(f"scheduler failed to start: {type(e).__name__}: {e}"))
        sys.exit(1)
    try:
        scheduler.event_loop()
    except Exception:
        logger.error("scheduler crashed:\n%s", traceback.format_exc())
        sys.exit(1)


def _rendezvous(server_args, port_args, dp_rank: int) -> str:
    """Where a replica's TP ranks meet: --dist-init-addr across nodes, else a file in the server's private
    ipc directory (torch's TCP store would listen on every interface whatever --host says)."""
    if server_args.dist_init_addr:
        return server_args.dist_init_addr
    return f"file://{port_args.ipc_dir}/dist-store-dp{dp_rank}"
