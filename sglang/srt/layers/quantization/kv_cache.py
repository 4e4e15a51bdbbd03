"""Per-layer scales of an FP8 KV cache: 1.0 unless the checkpoint carries `layers.N.self_attn.k_scale` /
`v_scale` tensors, or `--quantization-param-path` names a JSON file in vLLM's layout
({"kv_cache": {"scaling_factor": {"<tp rank>": {"<layer>": s}}}}; one scale for K and V).

Every scale is checked as it is read (configs/kv_scales.py: a finite number in (0, MAX_KV_SCALE]), and the
file before it is read (a regular file of at most MAX_PARAM_FILE_BYTES), so a bad one stops the start-up
with a `KVScaleError` naming it instead of serving NaN."""

from __future__ import annotations

import re

from sglang.srt.configs.kv_scales import KVScaleError, check_scale, param_file_scales

_SCALE_NAME = re.compile(r"layers\.(\d+)\.self_attn\.([kv])_scale$")


def is_scale_tensor(name: str) -> bool:
    """A checkpoint's KV cache scale: read by `checkpoint_kv_scales`, not a model parameter."""
    return bool(_SCALE_NAME.search(name))


def checkpoint_kv_scales(weights, num_layers: int | None = None) -> dict[int, list[float]]:
    """{layer: [k_scale, v_scale]} from (name, tensor) pairs; missing ones stay 1.0. Each tensor must hold
    one usable scale of a layer in [0, num_layers) (KVScaleError names the tensor, its layer and value)."""
    from sglang.srt.layers.checkpoint_tensor import materialize

    out: dict[int, list[float]] = {}
    for name, t in weights:
        m = _SCALE_NAME.search(name)
        if m:
            layer, which = int(m.group(1)), m.group(2)
            if num_layers is not None and not 0 <= layer < num_layers:
                raise KVScaleError(f"{name}: a KV cache scale of layer {layer}; the model has {num_layers} layers")
            t = materialize(t)
            if t.numel() != 1:
                raise KVScaleError(f"{name}: a KV cache scale is one number, this tensor has shape {tuple(t.shape)}")
            s = check_scale(float(t.double().item()), f"{name}: layer {layer} {which}_scale")
            out.setdefault(layer, [1.0, 1.0])[0 if which == "k" else 1] = s
    return out


def param_file_kv_scales(path: str, tp_rank: int, num_layers: int) -> dict[int, list[float]]:
    """{layer: [s, s]} of this TP rank from a --quantization-param-path file."""
    return {k: [s, s] for k, s in param_file_scales(path, tp_rank, num_layers).items()}
