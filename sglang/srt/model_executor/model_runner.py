"""Owns the model on one TP rank plus its KV memory pools and attention backend."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.layers.attention.base_attn_backend import create_attention_backend
from sglang.srt.layers.attention import torch_native_backend  # noqa: F401  (registers "torch_native")
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.model_loader.loader import get_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRunnerConfig:
    model_path: str
    dtype: str = "auto"
    device: str = "cpu"
    max_total_tokens: int = 16384
    max_running_requests: int = 64
    context_length: int | None = None
    attention_backend: str = "torch_native"


class ModelRunner:
    def __init__(self, cfg: ModelRunnerConfig, tp: TPInfo = SINGLE_RANK):
        self.cfg = cfg
        self.tp = tp
        self.device = torch.device(cfg.device)
        self.model = get_model(cfg.model_path, cfg.dtype, self.device, tp)
        self.model_config = self.model.config
        self.dtype = next(self.model.parameters()).dtype
        text = self.model_config.text
        self.context_length = cfg.context_length or text.max_position_embeddings
        attn = self.model.model.layers[0].self_attn
        self.req_to_token_pool = ReqToTokenPool(cfg.max_running_requests, self.context_length, self.device)
        self.token_to_kv_pool = MHATokenToKVPool(
            cfg.max_total_tokens, attn.num_kv_heads, text.head_dim, text.num_hidden_layers, self.dtype, self.device
        )
        self.allocator = TokenToKVPoolAllocator(cfg.max_total_tokens, self.device)
        self.attn_backend = create_attention_backend(cfg.attention_backend)

    @torch.inference_mode()
    def forward(self, forward_batch):
        forward_batch.req_to_token_pool = self.req_to_token_pool
        forward_batch.token_to_kv_pool = self.token_to_kv_pool
        forward_batch.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)
