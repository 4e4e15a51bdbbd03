"""Weight quantization: which method a checkpoint (its `quantization_config`) or `--quantization` asks
for, and the methods themselves, one module each (upstream's names: `fp8.py` holds `Fp8Config` and
`Fp8LinearMethod`). A format that is not implemented is refused by name at start-up."""

from __future__ import annotations

from typing import Any

from sglang.srt.layers.quantization.base import QuantizationError, column_groups_ok, column_tp_sizes
from sglang.srt.layers.quantization.fp8 import Fp8Config, Fp8LinearMethod

# --quantization values; a checkpoint's own quantization_config is read whatever this says
QUANTIZATION_CHOICES = ("fp8",)
# quant_method values seen in checkpoints that this engine does not load (each refused by name)
_REFUSED = {
    "awq": "AWQ int4", "gptq": "GPTQ", "compressed-tensors": "compressed-tensors (llm-compressor)",
    "bitsandbytes": "bitsandbytes", "marlin": "Marlin", "gguf": "GGUF", "modelopt": "ModelOpt",
    "fbgemm_fp8": "fbgemm per-channel FP8", "mxfp4": "MXFP4", "w8a8_int8": "int8 W8A8",
}


def quantization_config(raw: dict[str, Any], flag: str | None = None) -> Fp8Config | None:
    """The quantization of a model from its config.json (`raw`) and `--quantization` (`flag`).

    A checkpoint in Qwen's -FP8 layout (quant_method fp8 with weight_block_size) is served as stored;
    `--quantization fp8` on an unquantized checkpoint quantizes its text linears while loading."""
    qc = raw.get("quantization_config") or raw.get("text_config", {}).get("quantization_config")
    if qc:
        method = str(qc.get("quant_method", "")).lower()
        if method in _REFUSED:
            raise QuantizationError(f"the checkpoint is quantized with {_REFUSED[method]} (quant_method {method!r}), "
                                    "which this engine does not load; supported: fp8 with weight_block_size "
                                    "(Qwen's -FP8 releases)")
        if method != "fp8":
            raise QuantizationError(f"the checkpoint's quant_method {method!r} is not supported; supported: fp8 "
                                    "with weight_block_size (Qwen's -FP8 releases)")
        if flag not in (None, "fp8"):
            raise QuantizationError(f"--quantization {flag} does not match the checkpoint's quant_method fp8")
        return Fp8Config.from_checkpoint(qc)
    if flag is None:
        return None
    if flag not in QUANTIZATION_CHOICES:
        raise QuantizationError(f"--quantization {flag!r} is not supported; choose from {', '.join(QUANTIZATION_CHOICES)}")
    return Fp8Config.online()


def startup_problem(raw: dict[str, Any], flag: str | None, tp_size: int, ep_size: int = 1) -> str | None:
    """One line saying why this model cannot start quantized at this TP size, or None. Runs in the main
    process before any scheduler is spawned, from config.json alone. `--quantization fp8` of a float
    checkpoint refuses no TP size (each rank quantizes blocks of its own shard), MoE experts included
    (layers/moe/fp8_moe.py Fp8MoEMethod: Qwen3-VL-MoE and Qwen3.5-MoE)."""
    try:
        config = quantization_config(raw, flag)
    except QuantizationError as e:
        return str(e)
    if config is None or not config.serialized or tp_size == 1:
        return None
    text = raw.get("text_config", raw)
    moe = bool(text.get("num_experts") or text.get("num_local_experts"))
    heads, head_dim = text.get("num_attention_heads", 0), text.get("head_dim") or 0
    # (name, input features, ranks they are split over): the experts' down_proj over the tp/ep ranks of a group
    inputs = [("o_proj", heads * head_dim, tp_size), ("down_proj", text.get("intermediate_size", 0), tp_size),
              ("the shared expert's down_proj", text.get("shared_expert_intermediate_size", 0), tp_size)]
    if moe and ep_size >= 1 and tp_size % ep_size == 0:
        inputs.append(("the experts' down_proj", text.get("moe_intermediate_size", 0), tp_size // ep_size))
    bk = config.block[1]
    for name, k, ranks in inputs:
        if k and not column_groups_ok(k, ranks, bk):
            ok = column_tp_sizes(k, bk)
            what, sizes = ("--tp-size", "TP sizes") if ranks == tp_size else ("--tp-size / --ep-size", "tp/ep sizes")
            return (f"FP8 block scales: {what} {ranks} cuts {name}'s {k} input features into shards that start "
                    f"inside a {bk}-column block off a 16-column grid; {sizes} that work: {', '.join(map(str, ok))}")
    return None


def linear_method(config: Fp8Config | None, prefix: str, parts: tuple[str, ...] = ()):
    """The quantization method of the linear named `prefix` (fused from checkpoint modules `parts`), or None."""
    return None if config is None else config.method_for(prefix, parts)


__all__ = ["linear_method", "startup_problem", "QUANTIZATION_CHOICES", "Fp8Config", "Fp8LinearMethod", "QuantizationError", "quantization_config"]
