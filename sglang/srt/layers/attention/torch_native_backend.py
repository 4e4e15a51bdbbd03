"""Pure-torch attention over the token KV pool; runs on any device, one request at a time."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, register_attention_backend


@register_attention_backend("torch_native")
class TorchNativeAttnBackend(AttentionBackend):
    def _attend(self, q, layer, forward_batch, i: int, q_len: int) -> torch.Tensor:
        """q: (q_len, H, D) for request i, whose queries are the last q_len of its seq_len tokens."""
        seq_len = forward_batch.seq_lens_cpu[i]
        slots = forward_batch.req_to_token_pool.req_to_token[forward_batch.req_pool_indices[i], :seq_len]
        pool = forward_batch.token_to_kv_pool
        k = pool.get_key_buffer(layer.layer_id)[slots].to(q.dtype)
        v = pool.get_value_buffer(layer.layer_id)[slots].to(q.dtype)
        mask = None
        if q_len > 1:
            # query j sits at absolute position seq_len - q_len + j and sees keys 0..that position
            mask = torch.ones(q_len, seq_len, dtype=torch.bool, device=q.device).tril(seq_len - q_len)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.transpose(0, 1),
            v.transpose(0, 1),
            attn_mask=mask,
            scale=layer.scaling,
            enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
        )
        return out.transpose(0, 1)

    def _save(self, k, v, layer, forward_batch, save_kv_cache):
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        self._save(k, v, layer, forward_batch, save_kv_cache)
        out = torch.empty_like(q)
        for i, (start, n) in enumerate(zip(forward_batch.extend_start_locs(), forward_batch.extend_seq_lens_cpu)):
            if n:
                out[start : start + n] = self._attend(q[start : start + n], layer, forward_batch, i, n)
        return out

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        self._save(k, v, layer, forward_batch, save_kv_cache)
        out = torch.empty_like(q)
        for i in range(forward_batch.batch_size):
            out[i : i + 1] = self._attend(q[i : i + 1], layer, forward_batch, i, 1)
        return out
