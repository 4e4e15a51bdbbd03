"""Pure-torch attention over the token KV pool: runs on any device and is the tests' reference.

Decode attends the whole batch in one SDPA call over K/V gathered into a (B, max_seq_len) padded
block; prefill runs SDPA per request in query tiles (its causal mask differs per request). Every index
comes from the step's metadata: host ints for rows and lengths, device tensors for slots, so nothing
here reads a device value back.

Prefill memory: SDPA with a mask materializes (heads x queries x keys) float32 scores. A whole chunk at
once made that (chunk x context): an 88k-token prompt in 8192-token chunks grew the scheduler past 22 GB.
Queries go in tiles sized so one tile's scores stay under SCORE_TILE_BYTES, and each tile reads only the
keys its last query can see, so memory is bounded by the tile, whatever the context."""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, register_attention_backend
from sglang.srt.layers.attention.sdpa import sdpa

SCORE_TILE_BYTES = 64 << 20  # float32 scores of one (heads x query tile x keys) block


def query_tile(num_queries: int, num_keys: int, num_heads: int, budget: int | None = None) -> int:
    """Queries per tile: as many as keep heads x tile x keys float32 scores within `budget` (default
    SCORE_TILE_BYTES; at least 1)."""
    budget = SCORE_TILE_BYTES if budget is None else budget
    return max(1, min(num_queries, budget // (4 * num_heads * max(1, num_keys))))


@register_attention_backend("torch_native")
class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, **_):
        self._decode_slots: torch.Tensor | None = None  # (B, L) KV slots, padded past each seq_len
        self._decode_mask: torch.Tensor | None = None  # (B, 1, 1, L) True where a key exists

    def init_forward_metadata(self, forward_batch) -> None:
        if not forward_batch.forward_mode.is_decode():
            return
        fb = forward_batch
        length = fb.max_seq_len
        self._decode_slots = fb.req_to_token_pool.req_to_token[fb.req_pool_indices, :length]
        cols = torch.arange(length, device=fb.seq_lens.device)
        self._decode_mask = (cols.unsqueeze(0) < fb.seq_lens.unsqueeze(1)).view(fb.batch_size, 1, 1, length)

    def _save(self, k, v, layer, forward_batch, save_kv_cache):
        if save_kv_cache:
            forward_batch.token_to_kv_pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        self._save(k, v, layer, forward_batch, save_kv_cache)
        fb = forward_batch
        pool = fb.token_to_kv_pool
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        out = torch.empty_like(q)
        starts = fb.extend_start_locs()
        gqa = layer.tp_q_head_num != layer.tp_k_head_num
        for row, start, n, seq_len in zip(fb.req_pool_indices_cpu, starts, fb.extend_seq_lens_cpu, fb.seq_lens_cpu):
            if not n:
                continue
            slots = fb.req_to_token_pool.req_to_token[row, :seq_len]
            keys = k_buf[slots].to(q.dtype).transpose(0, 1)  # (Hk, seq_len, D)
            vals = v_buf[slots].to(q.dtype).transpose(0, 1)
            prefix = seq_len - n  # query j sits at absolute position prefix + j and sees keys 0..that position
            tile = query_tile(n, seq_len, q.shape[1])
            for lo in range(0, n, tile):
                hi = min(n, lo + tile)
                visible = prefix + hi  # keys the tile's last query sees
                # within the tile, query j (absolute prefix + lo + j) sees keys 0..prefix + lo + j
                mask = None if hi - lo == 1 else torch.ones(
                    hi - lo, visible, dtype=torch.bool, device=q.device).tril(prefix + lo)
                o = sdpa(
                    q[start + lo : start + hi].transpose(0, 1), keys[:, :visible], vals[:, :visible],
                    attn_mask=mask, scale=layer.scaling, enable_gqa=gqa,
                )
                out[start + lo : start + hi] = o.transpose(0, 1)
        return out

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        self._save(k, v, layer, forward_batch, save_kv_cache)
        pool = forward_batch.token_to_kv_pool
        slots = self._decode_slots
        keys = pool.get_key_buffer(layer.layer_id)[slots].to(q.dtype)  # (B, L, Hk, D)
        vals = pool.get_value_buffer(layer.layer_id)[slots].to(q.dtype)
        out = sdpa(
            q.unsqueeze(2), keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=self._decode_mask,
            scale=layer.scaling, enable_gqa=layer.tp_q_head_num != layer.tp_k_head_num,
        )  # (B, Hq, 1, D)
        return out.squeeze(2)
