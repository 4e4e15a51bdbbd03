"""CUDA graphs for decode: each captured batch size replays the whole model forward as one launch.

Invariants:
- every tensor the graph reads lives in a static buffer sized for the largest captured batch; a step
  copies its metadata into the first `bs` rows and resets the padding rows (token 0, one key, KV written
  to slot 0, the pool's padding sink), then replays the smallest captured size >= bs;
- the slot list (`kv_indices`) is filled eagerly before replay, into a buffer bounded by the KV pool, so
  the captured kernels see fixed shapes; the attention backend must support this (`supports_cuda_graph`);
- decode kernels are captured with the context length as their length hint, so their grid is fixed;
- anything the graph cannot take (a larger batch, more slots than the buffer) runs eagerly.

Hybrid models (Qwen3.5): the Gated DeltaNet layers' decode kernels address states in the state pool
through a slot per request (layers/attention/fla/pooled.py), read from `gdn_slots`, one more static
buffer: each step copies the batch's request rows in and points the padding requests at the pool's
padding row (mem_cache/state_pool.py), which no request owns, so no real state changes for padding. The
pool's queued copies are applied before replay, outside the graph (model_runner.py); a decode batch has
no fresh rows to zero and never snapshot captures (those come only with EXTEND batches; `can_run`
refuses one that carries any), so the captured step is one kernel round per layer. Only the kernel path
is captured: the per-request torch path loops in Python over host lists (model_runner.py refuses it).

`capture=False` (CPU tests) runs the same static-buffer forward eagerly at replay instead of a graph.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from sglang.srt.layers.attention.triton_backend import kv_indices_from_table
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


def capture_batch_sizes(max_bs: int, explicit: tuple[int, ...] | None = None) -> list[int]:
    """Upstream's default ladder (1, 2, 4, 8, then every 8) up to max_bs, or the explicit list."""
    if explicit:
        return sorted({b for b in explicit if 1 <= b})
    ladder = [1, 2, 4, 8, *range(16, max_bs + 1, 8)]
    return sorted({b for b in ladder if b <= max_bs} | {max_bs})


class CudaGraphRunner:
    def __init__(self, model_runner, batch_sizes: list[int], capture: bool = True):
        self.runner = model_runner
        self.capture = capture
        self.batch_sizes = sorted(batch_sizes)
        self.max_bs = self.batch_sizes[-1]
        dev = model_runner.device
        bs = self.max_bs
        i64 = dict(dtype=torch.int64, device=dev)
        self.input_ids = torch.zeros(bs, **i64)
        self.positions = torch.zeros(3, bs, **i64)
        self.req_pool_indices = torch.zeros(bs, **i64)
        self.seq_lens = torch.ones(bs, **i64)
        self.out_cache_loc = torch.zeros(bs, **i64)
        self.qo_indptr = torch.arange(bs + 1, **i64)
        self.kv_indptr = torch.arange(bs + 1, **i64)
        self.last_indices = torch.arange(bs, **i64)
        # live requests hold at most the pool's tokens, plus one sink key per padding row
        self.kv_capacity = model_runner.max_total_num_tokens + bs
        self.kv_indices = torch.zeros(self.kv_capacity, **i64)
        self.state_pool = getattr(model_runner, "state_pool", None)
        self.gdn_slots = None
        if self.state_pool is not None:  # hybrid: each request's state row, padding at the padding row
            if self.state_pool.padding_row is None:
                raise RuntimeError("decode CUDA graphs of a hybrid model need the state pool's padding row")
            self.gdn_slots = torch.full((bs,), self.state_pool.padding_row, **i64)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, LogitsProcessorOutput] = {}
        if capture:
            self._capture_all()

    # ------------------------------------------------------------------ capture
    def _static_batch(self, bs: int) -> ForwardBatch:
        r = self.runner
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, input_ids=self.input_ids[:bs], positions=self.positions[:, :bs],
            req_pool_indices=self.req_pool_indices[:bs], seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs], seq_lens_cpu=[1] * bs, qo_indptr=self.qo_indptr[: bs + 1],
            kv_indptr=self.kv_indptr[: bs + 1], last_indices=self.last_indices[:bs],
            max_seq_len=r.context_length, max_extend_len=1,
            req_to_token_pool=r.req_to_token_pool, token_to_kv_pool=r.token_to_kv_pool,
            attn_backend=r.attn_backend, mm_embedder=r.mm_embedder,
        )
        if self.gdn_slots is not None:  # the kernels read the static slot buffer, nothing per step
            fb.gdn_states = self.state_pool.graph_states(self.gdn_slots[:bs])
        return fb

    def _run_model(self, fb: ForwardBatch) -> LogitsProcessorOutput:
        self.runner.attn_backend.kv_indices = self.kv_indices
        return self.runner.model(fb.input_ids, fb.positions, fb)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        torch.cuda.synchronize(self.runner.device)
        free_before = torch.cuda.mem_get_info(self.runner.device)[0]
        start = time.perf_counter()
        stream = torch.cuda.Stream(self.runner.device)
        pool = None
        for bs in reversed(self.batch_sizes):  # largest first: smaller graphs reuse its memory pool
            fb = self._static_batch(bs)
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up: lazy initialisation and autotuning happen outside capture
                    self._run_model(fb)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                out = self._run_model(fb)
            pool = graph.pool()
            self.graphs[bs], self.outputs[bs] = graph, out
        torch.cuda.synchronize(self.runner.device)
        used = free_before - torch.cuda.mem_get_info(self.runner.device)[0]
        logger.info("captured decode CUDA graphs for %d batch sizes (%s) in %.1f s, %.0f MiB",
                    len(self.batch_sizes), ", ".join(map(str, self.batch_sizes)), time.perf_counter() - start,
                    used / 2**20)

    # ------------------------------------------------------------------ replay
    def can_run(self, fb: ForwardBatch) -> bool:
        if not fb.forward_mode.is_decode() or fb.batch_size > self.max_bs or fb.stage_timings is not None:
            return False
        if fb.gdn_captures:  # never in decode (module docstring); a captured step has no capture round
            return False
        padded = self.batch_sizes[bisect.bisect_left(self.batch_sizes, fb.batch_size)]
        return sum(fb.seq_lens_cpu) + padded - fb.batch_size <= self.kv_capacity

    @torch.inference_mode()
    def replay(self, fb: ForwardBatch) -> LogitsProcessorOutput:
        bs = fb.batch_size
        padded = self.batch_sizes[bisect.bisect_left(self.batch_sizes, bs)]
        self.input_ids[:bs].copy_(fb.input_ids)
        self.positions[:, :bs].copy_(fb.positions)
        self.req_pool_indices[:bs].copy_(fb.req_pool_indices)
        self.seq_lens[:bs].copy_(fb.seq_lens)
        self.out_cache_loc[:bs].copy_(fb.out_cache_loc)
        if padded > bs:  # padding rows: one key at the sink slot, KV written to the sink
            self.input_ids[bs:padded].zero_()
            self.positions[:, bs:padded].zero_()
            self.req_pool_indices[bs:padded].zero_()
            self.seq_lens[bs:padded].fill_(1)
            self.out_cache_loc[bs:padded].zero_()
        torch.cumsum(self.seq_lens[:padded], 0, out=self.kv_indptr[1 : padded + 1])
        total = sum(fb.seq_lens_cpu) + padded - bs
        indices = kv_indices_from_table(fb.req_to_token_pool.req_to_token, self.req_pool_indices[:padded],
                                        self.kv_indptr[: padded + 1], total)
        if padded > bs:  # the padding rows' one key is the sink, whatever their table row holds
            indices[total - (padded - bs):] = 0
        self.kv_indices[:total].copy_(indices)
        if self.gdn_slots is not None:  # device to device: the batch's rows, then the padding row
            self.gdn_slots[:bs].copy_(fb.req_pool_indices)
            self.gdn_slots[bs:padded].fill_(self.state_pool.padding_row)
        if not self.capture:  # CPU tests: the very forward the graph holds, run eagerly
            out = self._run_model(self._static_batch(padded))
            return LogitsProcessorOutput(next_token_logits=out.next_token_logits[:bs])
        self.graphs[padded].replay()
        return LogitsProcessorOutput(next_token_logits=self.outputs[padded].next_token_logits[:bs])
