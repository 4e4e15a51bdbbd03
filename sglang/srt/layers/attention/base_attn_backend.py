"""Interface every attention backend implements; models only ever call `forward`."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class AttentionBackend(ABC):
    def init_forward_metadata(self, forward_batch) -> None:
        """Precompute per-batch indices once, before the layers run."""

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        # An FP8 KV cache holds K / k_scale and V / v_scale: scaling q and the output instead of every
        # key and value read keeps the backends' reads plain (scales are 1.0 for any other cache)
        scales = getattr(forward_batch.token_to_kv_pool, "kv_scales", None)
        ks, vs = scales(layer.layer_id) if scales is not None else (1.0, 1.0)
        if ks != 1.0:
            q = q * ks
        if forward_batch.forward_mode.is_decode():
            out = self.forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        else:
            out = self.forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        return out if vs == 1.0 else out * vs

    @abstractmethod
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor: ...

    @abstractmethod
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor: ...


_BACKENDS: dict[str, type[AttentionBackend]] = {}


def register_attention_backend(name: str):
    def deco(cls):
        _BACKENDS[name] = cls
        return cls

    return deco


_LAZY = {"torch_native": "sglang.srt.layers.attention.torch_native_backend",
         "triton": "sglang.srt.layers.attention.triton_backend"}


def create_attention_backend(name: str, **kwargs) -> AttentionBackend:
    """Backends register on import; the built-in ones are imported here on first use, so a backend
    whose kernels need an optional package (triton) costs nothing unless chosen."""
    if name not in _BACKENDS and name in _LAZY:
        import importlib

        importlib.import_module(_LAZY[name])
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name](**kwargs)
