"""One TP rank's model worker: runs a scheduled batch through the model and samples next tokens."""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter

import torch

from sglang.srt.constrained.matcher import apply_grammar_bitmask, revive_dead_rows
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.sampler import (
    ROW_BANS,
    ROW_HAS_PENALTY,
    ROW_LOGIT_BIAS,
    ROW_LOGPROBS,
    Sampler,
    SamplingBatchInfo,
    adjust_logits,
    banned_tokens,
    logit_bias_entries,
    row_columns,
    sampling_row,
    token_logprobs,
)
from sglang.srt.environ import envs
from sglang.srt.managers.io_struct import FinishReason
from sglang.srt.managers.schedule_batch import ScheduleBatch, all_none
from sglang.srt.multimodal.deferred_decode import decode_failure
from sglang.srt.multimodal.transport.cuda_ipc_budget import cuda_ipc_reserved_bytes
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.sampling.custom_logit_processor import apply_custom_logit_processors
from sglang.srt.sampling.penalties import PenaltyState
from sglang.srt.server_args import ServerArgs


_PARAMS, _OUTPUT_IDS = attrgetter("sampling_params"), attrgetter("output_ids")
_FINISHED_REASON, _GRAMMAR = attrgetter("finished_reason"), attrgetter("grammar")
_CUSTOM_LP = attrgetter("custom_logit_processor")


class TpModelWorker:
    def __init__(self, server_args: ServerArgs, model_path: str, tp: TPInfo = SINGLE_RANK, gpu_id: int = 0,
                 dp_rank: int = 0):
        self.tp = tp
        device = server_args.resolved_device()
        lm_attention, mm_attention = server_args.resolved_attention_backends()
        self.model_runner = ModelRunner(
            ModelRunnerConfig(
                model_path=model_path,
                dtype=server_args.dtype,
                device=f"cuda:{gpu_id}" if device == "cuda" else device,
                max_total_tokens=server_args.max_total_tokens,
                mem_fraction_static=server_args.mem_fraction_static,
                max_running_requests=None if server_args.max_running_requests is None
                else server_args.max_running_requests + 1,
                context_length=server_args.context_length,
                attention_backend=lm_attention,
                mm_attention_backend=mm_attention,
                attention_fp32_precision=server_args.attention_fp32_precision,
                quantization=None if server_args.quantization in (None, "", "none") else server_args.quantization,
                kv_cache_dtype=server_args.kv_cache_dtype,
                quantization_param_path=server_args.quantization_param_path,
                load_format=server_args.load_format,
                seed=server_args.random_seed,
                reserved_device_bytes=tuple(cuda_ipc_reserved_bytes(
                    server_args.mm_feature_transport, envs.SGLANG_MM_FEATURE_CACHE_MB.get() << 20, gpu_id,
                    len(server_args.local_tp_ranks())).items()) if device == "cuda" else (),
                cuda_graph=not server_args.disable_cuda_graph,
                cuda_graph_max_bs=server_args.cuda_graph_max_bs_decode,
                cuda_graph_bs=server_args.cuda_graph_bs_decode,
                page_size=server_args.page_size,
                max_mamba_cache_size=server_args.max_mamba_cache_size,
                enable_vit_ulysses_sp=server_args.enable_vit_ulysses_sp,
                mm_enable_dp_encoder=server_args.mm_enable_dp_encoder,
                language_only=server_args.language_only,
            ),
            tp,
        )
        # Each --dp-size replica draws its own seed stream (an n=2 chat split across two replicas would
        # otherwise sample the same tokens twice); every TP rank of a replica draws the same one, so its
        # ranks stay in step. Replica 0 keeps --random-seed's stream, the one a single server has.
        self.sampler = Sampler(server_args.random_seed + dp_rank)
        self.vocab_size = self.model_runner.model_config.text.vocab_size
        self.eos_ids = sorted(self.model_runner.model_config.eos_token_ids)
        # token statistics of requests with penalties, on the device across steps
        self.penalties = PenaltyState(self.vocab_size, self.model_runner.device)
        self._last_sampled: tuple[int, torch.Tensor] | None = None  # (batch seq, ids): overlap's future tokens

    def prepare(self, batch: ScheduleBatch, stage_timer_on: bool = False):
        """The batch's forward inputs, read from its requests now (the overlap scheduler builds them
        before the step runs, while it goes on changing the requests' host state)."""
        return batch.to_forward_batch(self.model_runner.device, stage_timer_on)

    @torch.inference_mode()
    def forward_batch_generation(self, batch: ScheduleBatch, stage_timer_on: bool = False, forward_batch=None,
                                 before_sampling=None):
        """Runs the batch; returns (one sampled token per request, meaningful only for requests whose
        prompt is complete after this step; the stage timer's batch totals; per-request logprobs, None
        where not asked: (token logprob, [(logprob, token id), ...] top alternatives); prompt logprobs,
        one (logprob, alternatives) per `batch.input_logprob_owners` entry).

        Overlap scheduling: `forward_batch` was prepared earlier, its rows in `batch.future_rows` take the
        token the previous batch sampled (still on the device); `before_sampling` returns once the
        scheduler has applied that previous batch's tokens, so everything sampling reads from the
        requests (output ids, grammars, penalties) is as the step-by-step scheduler would see it.
        Requests that finished meanwhile ride along: their rows are computed and their tokens dropped."""
        runner = self.model_runner
        fb = forward_batch if forward_batch is not None else batch.to_forward_batch(runner.device, stage_timer_on)
        if batch.future_rows is not None:
            self._resolve_future_tokens(fb, batch)
        self._last_sampled = None  # set again below; a failed step leaves nothing to resolve from
        out = runner.forward(fb)
        if batch.mode.is_extend():
            self._abort_undecodable(batch.reqs)
        if before_sampling is not None:
            before_sampling()
        # Per-request reads below are C-level maps and scans (no Python frame per request): this is a decode
        # step's hot loop. What derives from a request's sampling params alone is computed once per request.
        reqs = batch.reqs
        params = list(map(_PARAMS, reqs))
        outputs = list(map(_OUTPUT_IDS, reqs))
        cols = row_columns(self._sampling_rows(reqs))
        info = SamplingBatchInfo.from_columns(cols, runner.device, steps=list(map(len, outputs)), rng=self.sampler.rng)
        logits = out.next_token_logits
        # None when no request of the batch has a penalty
        penalized = self.penalties.prepare(reqs) if any(cols[ROW_HAS_PENALTY]) else None
        if penalized is not None:
            logits = self.penalties.apply(logits, penalized)
        grammar_rows = []
        # rows whose token is dropped (a prompt chunk, a re-prefill): no grammar mask, no custom processor
        dropped = ({i for i, r in enumerate(reqs) if r.is_prefilling() or r.output_ids}
                   if batch.mode.is_extend() else set())
        if not all_none(map(_FINISHED_REASON, reqs)):  # overlap: ended while this step was queued
            dropped |= {i for i, r in enumerate(reqs) if r.finished()}
        if not all_none(map(_GRAMMAR, reqs)):  # constrained output: disallowed tokens -inf, in place
            grammars = [None if i in dropped else r.grammar for i, r in enumerate(reqs)]
            grammar_rows = apply_grammar_bitmask(logits, grammars, outputs, self.vocab_size)
        grammar_masked = logits
        # both are None unless some request has min_new_tokens > 0 / a non-empty logit_bias
        if any(cols[ROW_BANS]):
            info.banned = banned_tokens(params, outputs, self.eos_ids, runner.device)
        if any(cols[ROW_LOGIT_BIAS]):
            info.logit_bias = logit_bias_entries(params, runner.device)
        logits = adjust_logits(logits, info)  # after the penalties, as the sampler's own order has it
        if grammar_rows and info.banned is not None:  # a min_new_tokens ban must not leave a row no token
            logits = revive_dead_rows(logits, grammar_masked, grammar_rows)
        if not all_none(map(_CUSTOM_LP, reqs)):  # last, on what would be sampled (upstream's order)
            for row, message, status in apply_custom_logit_processors(logits, reqs, dropped, self.tp):
                # the client's code failed or ran out of time (the ranks agreed on which rows): its request
                # ends with no token from this row, alike on every rank; the batch goes on
                reqs[row].to_abort = FinishReason("abort", message=message, status_code=status)
        ids = self.sampler(logits, info)
        self._last_sampled = (batch.seq, ids)
        logprobs = None
        if any(cols[ROW_LOGPROBS]):
            logprobs = self._logprobs(logits, ids, params)
        input_logprobs = self._input_logprobs(out.input_logprobs) if out.input_logprobs is not None else []
        return ids.tolist(), fb.stage_totals or {}, logprobs, input_logprobs  # the step's device-to-host copies

    def _sampling_rows(self, reqs) -> list[tuple]:
        """Each request's `sampling_row` (sampler.py), kept on the request as `_sampling_row` from the step that
        first samples it: its sampling params are fixed once it is scheduled, and one worker (vocabulary)
        samples it. Requests without one (their first step) get it here."""
        rows = list(map(getattr, reqs, repeat("_sampling_row"), repeat(None)))
        if None in rows:
            for i, r in enumerate(reqs):
                if rows[i] is None:
                    rows[i] = r._sampling_row = sampling_row(r.sampling_params, self.vocab_size)
        return rows

    @staticmethod
    def _abort_undecodable(reqs) -> None:
        """A deferred JPEG broken past its header was encoded as a blank image so the batch could go on: its
        request ends with a 400 naming the image (alike on every rank: they decode the same bytes), and its
        KV, computed from the stand-in, is never offered to the prefix cache."""
        for r in reqs:
            if r.mm_inputs is not None and r.to_abort is None:
                message = decode_failure(r.mm_inputs)
                if message is not None:
                    r.kv_cacheable = False
                    r.to_abort = FinishReason("abort", message=message, status_code=400)

    def _resolve_future_tokens(self, fb, batch: ScheduleBatch) -> None:
        """Decode rows whose input is the token the previous step sampled: copied on the device from that
        step's ids (`batch.future_rows`: (row, row in the previous batch) pairs, against batch
        `batch.future_seq`)."""
        last = self._last_sampled
        if last is None or last[0] != batch.future_seq:
            raise RuntimeError(f"the step this batch continues (#{batch.future_seq}) did not complete")
        rows, src = zip(*batch.future_rows)
        dst = torch.tensor(rows, dtype=torch.int64).to(fb.input_ids.device, non_blocking=True)
        idx = torch.tensor(src, dtype=torch.int64).to(last[1].device, non_blocking=True)
        fb.input_ids[dst] = last[1][idx].to(fb.input_ids.dtype)

    @staticmethod
    def _input_logprobs(scored) -> list:
        chosen, top = scored
        chosen = chosen.tolist()
        if top is None:
            return [(lp, []) for lp in chosen]
        return [(lp, list(zip(v, i))) for lp, v, i in zip(chosen, top[0].tolist(), top[1].tolist())]

    @staticmethod
    def _logprobs(logits: torch.Tensor, ids: torch.Tensor, params: list) -> list:
        top_n = max(p.top_logprobs_num for p in params)
        chosen, top = token_logprobs(logits, ids, top_n)
        chosen = chosen.tolist()
        top_v, top_i = (top[0].tolist(), top[1].tolist()) if top is not None else (None, None)
        out = []
        for b, p in enumerate(params):
            if not (p.return_logprob or p.top_logprobs_num):
                out.append(None)
                continue
            alts = list(zip(top_v[b][: p.top_logprobs_num], top_i[b][: p.top_logprobs_num])) if top_v else []
            out.append((chosen[b], alts))
        return out

    # ------------------------------------------------------------------ multimodal embedding state
    def mm_encoded_images(self, rid: str) -> int:
        return self.model_runner.mm_embedder.encoded_images(rid)

    def release_request(self, rid: str) -> None:
        """A finished request's embedder state (pending image rows, counters) and penalty row go."""
        self.model_runner.mm_embedder.release(rid)
        self.penalties.release(rid)

    def forget_retracted(self, rid: str) -> None:
        """A retracted request's penalty row goes (rebuilt from its prompt and outputs when it is
        prefilled again); its embedder state stays for the re-prefill."""
        self.penalties.release(rid)

    def clear_mm_cache(self) -> None:
        self.model_runner.mm_embedder.clear()

    def mm_stats(self) -> dict:
        return self.model_runner.mm_embedder.stats()

    def path_stats(self) -> dict:
        from sglang.srt.model_executor.path_stats import path_stats

        return path_stats(self.model_runner)
