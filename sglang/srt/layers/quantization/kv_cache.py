"""Per-layer scales of an FP8 KV cache: 1.0 unless the checkpoint carries `layers.N.self_attn.k_scale` /
`v_scale` tensors, or `--quantization-param-path` names a JSON file in vLLM's layout
({"kv_cache": {"scaling_factor": {"<tp rank>": {"<layer>": s}}}}; one scale for K and V)."""

from __future__ import annotations

import json
import re
from pathlib import Path

_SCALE_NAME = re.compile(r"layers\.(\d+)\.self_attn\.([kv])_scale$")


def is_scale_tensor(name: str) -> bool:
    """A checkpoint's KV cache scale: read by `checkpoint_kv_scales`, not a model parameter."""
    return bool(_SCALE_NAME.search(name))


def checkpoint_kv_scales(weights) -> dict[int, list[float]]:
    """{layer: [k_scale, v_scale]} from (name, tensor) pairs; missing ones stay 1.0."""
    from sglang.srt.model_loader.weight_utils import materialize

    out: dict[int, list[float]] = {}
    for name, t in weights:
        m = _SCALE_NAME.search(name)
        if m:
            out.setdefault(int(m.group(1)), [1.0, 1.0])[0 if m.group(2) == "k" else 1] = float(materialize(t).float().item())
    return out


def param_file_kv_scales(path: str, tp_rank: int, num_layers: int) -> dict[int, list[float]]:
    """{layer: [s, s]} of this TP rank from a --quantization-param-path file."""
    try:
        data = json.loads(Path(path).read_text())
        table = data["kv_cache"]["scaling_factor"]
        rank = table.get(str(tp_rank), table.get("0"))
        scales = {int(layer): float(s) for layer, s in rank.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--quantization-param-path {path}: expected {{\"kv_cache\": {{\"scaling_factor\": "
                         f"{{\"<tp rank>\": {{\"<layer>\": scale}}}}}}}}: {type(e).__name__}: {e}") from None
    bad = [k for k, s in scales.items() if not (0 <= k < num_layers) or not s > 0]
    if bad:
        raise ValueError(f"--quantization-param-path {path}: layers {bad} out of range or scales not positive")
    return {k: [s, s] for k, s in scales.items()}
