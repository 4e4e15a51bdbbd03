"""One TP rank's model worker: runs a scheduled batch through the model and samples next tokens."""

from __future__ import annotations

import torch

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.sampler import Sampler, SamplingBatchInfo
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig
from sglang.srt.server_args import ServerArgs


class TpModelWorker:
    def __init__(self, server_args: ServerArgs, model_path: str, tp: TPInfo = SINGLE_RANK, gpu_id: int = 0):
        self.tp = tp
        device = server_args.resolved_device()
        self.model_runner = ModelRunner(
            ModelRunnerConfig(
                model_path=model_path,
                dtype=server_args.dtype,
                device=f"cuda:{gpu_id}" if device == "cuda" else device,
                max_total_tokens=server_args.max_total_tokens,
                mem_fraction_static=server_args.mem_fraction_static,
                max_running_requests=server_args.max_running_requests + 1,
                context_length=server_args.context_length,
                attention_backend=server_args.attention_backend,
                page_size=server_args.page_size,
            ),
            tp,
        )
        self.sampler = Sampler(server_args.random_seed)
        self.vocab_size = self.model_runner.model_config.text.vocab_size

    @torch.inference_mode()
    def forward_batch_generation(self, batch: ScheduleBatch, stage_timer_on: bool = False) -> tuple[list[int], dict]:
        """Runs the batch; returns one sampled token per request (meaningful only for requests
        whose prompt is complete after this step) and the stage timer's batch totals."""
        runner = self.model_runner
        fb = batch.to_forward_batch(runner.device, stage_timer_on)
        out = runner.forward(fb)
        info = SamplingBatchInfo.from_params(
            [r.sampling_params for r in batch.reqs],
            [r.sampling_params.seed for r in batch.reqs],
            self.vocab_size,
            runner.device,
            steps=[len(r.output_ids) for r in batch.reqs],
            rng=self.sampler.rng,
        )
        tokens = self.sampler(out.next_token_logits, info).tolist()  # the step's one device-to-host copy
        return tokens, fb.stage_totals or {}

    # ------------------------------------------------------------------ multimodal embedding state
    def mm_encoded_images(self, rid: str) -> int:
        return self.model_runner.mm_embedder.encoded_images(rid)

    def release_request(self, rid: str) -> None:
        """A finished request's embedder state (pending image rows, counters) is dropped."""
        self.model_runner.mm_embedder.release(rid)

    def clear_mm_cache(self) -> None:
        self.model_runner.mm_embedder.clear()

    def mm_stats(self) -> dict:
        return self.model_runner.mm_embedder.stats()
