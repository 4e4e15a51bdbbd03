"""Attention through our own Triton kernels (sgl-kernel): paged prefill with a cached prefix and
split-KV decode, reading K/V in place from the pool (no gather, no repeated KV heads, no score matrix).

Runs on CUDA, and on CPU tensors under TRITON_INTERPRET=1 (how the CPU suite checks it). The step's
KV slot list is built once per forward, on the device, from the request-to-token table: nothing here
reads a device value back."""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend, register_attention_backend


def kv_indices_from_table(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, kv_indptr: torch.Tensor,
                          total: int) -> torch.Tensor:
    """Every request's KV slots, concatenated in sequence order: request b owns
    [kv_indptr[b], kv_indptr[b+1]). `total` (= kv_indptr[-1]) is known on the host."""
    tok = torch.arange(total, device=kv_indptr.device, dtype=kv_indptr.dtype)
    owner = torch.searchsorted(kv_indptr[1:], tok, right=True)
    return req_to_token[req_pool_indices[owner], tok - kv_indptr[owner]]


@register_attention_backend("triton")
class TritonAttnBackend(AttentionBackend):
    # decode reads only fixed-shape tensors given a slot-list buffer: CudaGraphRunner fills one per step
    supports_cuda_graph = True

    def __init__(self, num_kv_splits: int = 8, fp32_precision: str = "tf32", **_):
        from sgl_kernel.attention import decode_attention_fwd, extend_attention_fwd

        self._decode = decode_attention_fwd
        self._extend = extend_attention_fwd
        self.num_kv_splits = num_kv_splits
        self.fp32_precision = fp32_precision
        self.kv_indices: torch.Tensor | None = None

    def init_forward_metadata(self, forward_batch) -> None:
        fb = forward_batch
        self.kv_indices = kv_indices_from_table(fb.req_to_token_pool.req_to_token, fb.req_pool_indices,
                                                fb.kv_indptr, sum(fb.seq_lens_cpu))

    def _buffers(self, layer, forward_batch, k, v, save_kv_cache):
        pool = forward_batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer.layer_id, forward_batch.out_cache_loc, k, v)
        return pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        k_buf, v_buf = self._buffers(layer, forward_batch, k, v, save_kv_cache)
        fb = forward_batch
        return self._extend(q, k_buf, v_buf, fb.qo_indptr, fb.kv_indptr, self.kv_indices, fb.max_extend_len,
                            layer.scaling, fp32_precision=self.fp32_precision)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        k_buf, v_buf = self._buffers(layer, forward_batch, k, v, save_kv_cache)
        fb = forward_batch
        return self._decode(q, k_buf, v_buf, fb.kv_indptr, self.kv_indices, fb.max_seq_len, layer.scaling,
                            self.num_kv_splits, fp32_precision=self.fp32_precision)
