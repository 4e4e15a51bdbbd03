"""Token embedding and LM head with the vocabulary split across TP ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.checkpoint_tensor import materialize


class VocabParallelEmbedding(nn.Module):
    """Rank r holds rows [r*shard, (r+1)*shard) of the (padded) vocabulary."""

    def __init__(self, num_embeddings: int, embedding_dim: int, tp: TPInfo = SINGLE_RANK, dtype=None):
        super().__init__()
        self.tp = tp
        self.num_embeddings = num_embeddings
        self.shard_size = -(-num_embeddings // tp.size)
        self.vocab_start = tp.rank * self.shard_size
        self.vocab_end = min(self.vocab_start + self.shard_size, num_embeddings)
        dtype = dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.zeros(self.shard_size, embedding_dim, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape[0] != self.num_embeddings or loaded.shape[1] != param.shape[1]:
            raise ValueError(
                f"embedding checkpoint shape {tuple(loaded.shape)} != ({self.num_embeddings}, {param.shape[1]})"
            )
        rows = self.vocab_end - self.vocab_start
        param.data[:rows].copy_(materialize(loaded.narrow(0, self.vocab_start, rows)).to(param.dtype))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        mask = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(mask, input_ids - self.vocab_start, torch.zeros_like(input_ids))
        out = F.embedding(local, self.weight) * mask.unsqueeze(-1).to(self.weight.dtype)
        return tensor_model_parallel_all_reduce(out, self.tp)


class ParallelLMHead(VocabParallelEmbedding):
    """Same sharding as the embedding; used by LogitsProcessor as a matrix, never called directly."""

    def forward(self, input_ids):  # pragma: no cover - guard against misuse
        raise RuntimeError("ParallelLMHead is applied through LogitsProcessor")
