"""The scheduler's part of `/update_weights_from_disk` (upstream's `SchedulerUpdateWeightsMixin`): each
phase of an `UpdateWeightFromDiskReqInput` on every TP rank of this replica, rank 0 answering for it.

The tokenizer manager sends "load" only once no request is in flight on any replica (its gate), so the
scheduler is idle for the whole update: nothing runs on half-loaded weights. "load" is all-or-none across
the replica's ranks: each loads undoably, the ranks exchange their outcome, and when any failed the ones
that loaded restore at once. "commit" drops the undo copy and flushes what was computed from the old
weights (the radix cache's KV, the vision embedding cache); "rollback" restores a replica whose ranks all
loaded while another replica failed. The tokenizer side always sends one of them after a load (it shields
the update from its caller); a load whose commit or rollback never came is rolled back before the next load.

FP8 KV cache: each rank reloads its scales with the weights (weight_update.py). On commit the prefix cache is
flushed even with `flush_cache: false` (its entries were stored under the old scales), and captured decode
CUDA graphs, which hold the scales they were captured with, are captured again. Both are decided by the KV
dtype and the graphs' presence, the same on every rank, so the ranks' caches and collectives stay in step."""

from __future__ import annotations

import logging

from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput, UpdateWeightFromDiskReqOutput
from sglang.srt.model_loader.weight_update import StagedWeights

logger = logging.getLogger(__name__)


class SchedulerUpdateWeightsMixin:
    """Needs from its host: server_args, tp, dp_rank, report_dp_rank, worker, tree, is_idle(), _apply_aborts()
    and send()."""

    _staged_weights: StagedWeights | None = None

    def handle_update_weights(self, req: UpdateWeightFromDiskReqInput) -> None:
        if req.phase == "load":
            success, message = self._load_weights(req)
        elif req.phase in ("commit", "rollback"):
            staged, self._staged_weights = self._staged_weights, None
            if staged is not None:
                if req.phase == "commit":
                    staged.commit()
                    if req.flush_cache or staged.kv_pool is not None:
                        self.tree.reset()  # KV of cached prefixes came from the old weights (and scales)
                    if req.flush_cache:
                        self.worker.clear_mm_cache()  # and so did the cached vision embeddings
                    if staged.kv_pool is not None:
                        self._recapture_decode_graphs()
                else:
                    staged.restore()
            success, message = True, req.phase
        else:
            success, message = False, f"unknown weight update phase {req.phase!r}"
        if self.tp.rank == 0:
            self.send(UpdateWeightFromDiskReqOutput(success, message, self.dp_rank, req.req_id))

    def _load_weights(self, req: UpdateWeightFromDiskReqInput) -> tuple[bool, str]:
        error = None
        if self._staged_weights is not None:  # an earlier load's commit or rollback never came: undo it first
            logger.warning("weight update: a load was neither committed nor rolled back; restoring the weights")
            self._staged_weights.restore()
            self._staged_weights = None
        # a request whose client left is over for the tokenizer manager, but its abort (sent before this
        # message) is only marked on a running request: end it now, as the next step would
        self._apply_aborts()
        if self.server_args.quantization not in (None, "", "none"):
            # --quantization fp8 quantizes float weights while loading, replacing the parameters
            error = "weights cannot be updated with --quantization: restart the server on the new checkpoint"
        elif not self.is_idle():  # the tokenizer manager's gate makes this unreachable; never load under a batch
            error = "requests are running on this replica"
        if error is None:
            runner = self.worker.model_runner
            fp8_pool = runner.token_to_kv_pool if runner.kv_dtype != runner.dtype else None
            staged = StagedWeights(runner.model, fp8_pool, runner.cfg.quantization_param_path, self.tp.rank)
            try:
                staged.load(req.model_path, req.load_format)
                self._staged_weights = staged
            except Exception as e:  # a bad path or checkpoint: this replica keeps its weights
                error = f"{type(e).__name__}: {e}"
        errors = self._gather_errors(error)
        failed = [(rank, e) for rank, e in enumerate(errors) if e is not None]
        if not failed:
            return True, f"Succeeded to update model weights from {req.model_path}."
        if self._staged_weights is not None:  # this rank loaded, another did not: all keep the old weights
            self._staged_weights.restore()
            self._staged_weights = None
        rank, e = failed[0]
        where = f" on TP rank {rank}" if self.tp.size > 1 else ""
        if self.report_dp_rank:
            where += f" of DP replica {self.dp_rank}"
        logger.error("weight update from %s failed%s: %s", req.model_path, where, e)
        return False, f"Failed to update weights{where}: {e}. Every rank keeps the weights it had."

    def _recapture_decode_graphs(self) -> None:
        """Decode CUDA graphs captured the old KV scales as constants: capture them again (the old ones are
        released first; a capture that fails leaves decode eager, as at start-up)."""
        runner = self.worker.model_runner
        if getattr(runner, "cuda_graph_runner", None) is None:
            return
        runner.cuda_graph_runner = None
        runner.cuda_graph_runner = runner._init_cuda_graphs()

    def _gather_errors(self, error: str | None) -> list[str | None]:
        """Every TP rank's outcome of the load, in rank order (the same list on every rank)."""
        if self.tp.size == 1:
            return [error]
        import torch.distributed as dist

        out: list = [None] * self.tp.size
        dist.all_gather_object(out, error, group=self.tp.cpu_group)
        return out
