"""What the KV cache and one prefill chunk may take of a device (or the host), decided at start-up.

The KV budget is mem_fraction_static of the device less what is resident (weights, the context) and
what other processes will place there later (`reserved`: the cuda_ipc feature pool and the contexts
that map it, `multimodal/transport/cuda_ipc_budget.py`).

A chunk's transient memory grows with the chunk (hidden states, q/k/v, the MLP's intermediate) and with
the context it attends (the keys gathered per layer), never with chunk x context since prefill attention
runs in bounded query tiles. Hybrid models (Qwen3.5) add a linear-attention layer's tensors and the chunked
gated delta rule kernel's float32 workspace (`gdn_chunk_workspace_bytes`: ~384 MiB at 8192 tokens for
Qwen3.5-4B at TP 1). A server whose chunk does not fit used to die on its first long prompt (the
kernel's OOM killer took the scheduler, every client got 503); now start-up shrinks the chunk to what
fits, with one log line, or refuses with one line when not even the smallest chunk fits.
"""

from __future__ import annotations

import os

from sglang.srt.layers.attention.torch_native_backend import SCORE_TILE_BYTES

MIN_CHUNK = 256
PROMPT_LOGPROB_ROWS = 512  # rows of vocabulary logits the logits processor scores at a time
HEADROOM = 0.9  # of the free memory: the allocator's own slack and everything not modelled here


def prefill_activation_bytes(text, chunk_tokens: int, context_length: int, dtype_bytes: int,
                             tp_size: int = 1) -> int:
    """Peak transient bytes of one prefill forward of `chunk_tokens` tokens on one TP rank (an upper
    estimate: the layer's tensors that can be alive at once, plus the attention tile and logits)."""
    heads_q = max(1, text.num_attention_heads // tp_size)
    heads_kv = max(1, text.num_key_value_heads // tp_size)
    inter = text.intermediate_size // tp_size
    hidden = chunk_tokens * text.hidden_size * dtype_bytes * 6  # residual, norm, attention and MLP outputs
    qkv = chunk_tokens * (heads_q + 2 * heads_kv) * text.head_dim * dtype_bytes * 2  # projection + rotary
    mlp = chunk_tokens * inter * dtype_bytes * 3  # gate and up (fused), the activation
    keys = context_length * heads_kv * text.head_dim * dtype_bytes * 4  # K and V gathered, then transposed
    # one query tile's scores, probabilities and mask: a tile holds at most the whole chunk's scores
    scores = min(SCORE_TILE_BYTES, chunk_tokens * context_length * heads_q * 4) * 3
    # float32 logits and their log-softmax, for at most PROMPT_LOGPROB_ROWS of the chunk's rows at a time
    logits = min(PROMPT_LOGPROB_ROWS, chunk_tokens) * text.vocab_size * 4 * 2
    return hidden + qkv + mlp + keys + scores + logits + gdn_prefill_bytes(text, chunk_tokens, dtype_bytes, tp_size)


def gdn_chunk_workspace_bytes(text, chunk_tokens: int, tp_size: int = 1) -> int:
    """The float32 workspace the chunked gated delta rule kernel (sgl_kernel.gdn) allocates for one layer's
    call over `chunk_tokens` tokens: normalised q and k (Hk x Dk each), the UT transform's w (Hv x Dk) and
    u (Hv x Dv) per token. 0 for a model without linear attention. (Snapshot captures split a chunk into
    rounds of fewer tokens: the whole chunk is the peak.)"""
    h = getattr(text, "hybrid", None)
    if h is None:
        return 0
    hk, hv = max(1, h.linear_num_key_heads // tp_size), max(1, h.linear_num_value_heads // tp_size)
    dk, dv = h.linear_key_head_dim, h.linear_value_head_dim
    return chunk_tokens * (2 * hk * dk + hv * dk + hv * dv) * 4


def gdn_prefill_bytes(text, chunk_tokens: int, dtype_bytes: int, tp_size: int = 1) -> int:
    """A linear-attention layer's transient bytes beyond the attention terms above: its projections (q|k|v
    and the gate z), the conv output, the decays (float32) and beta, its output o, and the chunk kernel's
    workspace. 0 for a model without linear attention."""
    h = getattr(text, "hybrid", None)
    if h is None:
        return 0
    hv = max(1, h.linear_num_value_heads // tp_size)
    conv_dim = h.conv_dim // tp_size
    value_dim = hv * h.linear_value_head_dim
    acts = chunk_tokens * ((2 * conv_dim + 2 * value_dim) * dtype_bytes + hv * (4 + dtype_bytes))
    return acts + gdn_chunk_workspace_bytes(text, chunk_tokens, tp_size)


def kv_budget_tokens(total: int, free: int, mem_fraction_static: float, reserved: int,
                     bytes_per_token: int) -> tuple[int, int]:
    """(tokens, budget bytes): the KV cache gets mem_fraction_static of the device, less what is already
    resident (weights, this process's context) and what other processes will place there later."""
    used = total - free
    budget = int(total * mem_fraction_static) - used - reserved
    return max(0, budget) // bytes_per_token, budget


def available_bytes(device) -> int:
    """Free device memory now (CUDA), or the host's MemAvailable (CPU)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def fit_chunk(chunk: int, need, available: int) -> tuple[int, str | None]:
    """(chunk size to use, one log line or None). `need(n)` is the activation bytes of an n-token
    chunk. Halves the chunk until it fits HEADROOM of `available`; raises when even MIN_CHUNK does not."""
    budget = int(available * HEADROOM)
    size = chunk
    while need(size) > budget and size > MIN_CHUNK:
        size = max(MIN_CHUNK, size // 2)
    gib = 1 << 30
    if need(size) > budget:
        raise RuntimeError(
            f"a {size}-token prefill chunk needs ~{need(size) / gib:.2f} GiB of activations but only "
            f"{available / gib:.2f} GiB are free after the KV cache: lower --mem-fraction-static or "
            f"--max-total-tokens, or use a smaller --context-length")
    if size == chunk:
        return chunk, None
    return size, (f"--chunked-prefill-size {chunk} needs ~{need(chunk) / gib:.2f} GiB of activations, "
                  f"{available / gib:.2f} GiB are free after the KV cache: prefilling in chunks of {size} tokens")
