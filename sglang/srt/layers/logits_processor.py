"""Turns final hidden states into next-token logits (and, on request, logits for every position)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglang.srt.distributed.communication_op import tensor_model_parallel_all_gather
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # (batch, vocab) float32
    full_logits: torch.Tensor | None = None  # (tokens, vocab) float32 when requested
    # prompt logprobs, one row per forward_batch.input_logprob_rows entry: the target token's logprob
    # (rows,), and the top alternatives' (values, ids) (rows, k) when k > 0
    input_logprobs: tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None] | None = None


# rows of (rows, vocab) float32 logits live at once while scoring a prompt: 512 x 152k = 0.3 GB,
# beside a KV pool that holds most of the device
INPUT_LOGPROB_CHUNK = 512


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int, tp: TPInfo = SINGLE_RANK):
        super().__init__()
        self.vocab_size = vocab_size
        self.tp = tp

    def _logits(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = torch.matmul(hidden, weight.t())
        logits = tensor_model_parallel_all_gather(logits, self.tp)
        return logits[:, : self.vocab_size].float()

    def forward(self, hidden_states: torch.Tensor, lm_head_weight: torch.Tensor, forward_batch) -> LogitsProcessorOutput:
        last = forward_batch.last_indices  # built with the step's metadata
        next_logits = self._logits(hidden_states[last], lm_head_weight)
        full = self._logits(hidden_states, lm_head_weight) if forward_batch.return_all_logits else None
        input_lp = None
        if forward_batch.input_logprob_rows is not None:
            input_lp = self._input_logprobs(hidden_states, lm_head_weight, forward_batch)
        return LogitsProcessorOutput(next_token_logits=next_logits, full_logits=full, input_logprobs=input_lp)

    def _input_logprobs(self, hidden: torch.Tensor, weight: torch.Tensor, fb):
        """Log-softmax of the raw logits (no penalties or temperature) at the scored rows, in chunks so a
        long prompt never holds (prompt, vocab) logits at once."""
        k = fb.input_top_logprobs_num
        chosen, top_v, top_i = [], [], []
        for lo in range(0, fb.input_logprob_rows.numel(), INPUT_LOGPROB_CHUNK):
            rows = fb.input_logprob_rows[lo : lo + INPUT_LOGPROB_CHUNK]
            lsm = torch.log_softmax(self._logits(hidden[rows], weight), dim=-1)
            chosen.append(lsm.gather(1, fb.input_logprob_targets[lo : lo + INPUT_LOGPROB_CHUNK, None]).squeeze(1))
            if k:
                v, i = lsm.topk(k, dim=-1)
                top_v.append(v)
                top_i.append(i)
        return torch.cat(chosen), ((torch.cat(top_v), torch.cat(top_i)) if k else None)
