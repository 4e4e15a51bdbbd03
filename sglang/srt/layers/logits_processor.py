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
        return LogitsProcessorOutput(next_token_logits=next_logits, full_logits=full)
