"""What one model forward needs to know about its batch: flattened tokens, positions, KV locations."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.utils.host_tensors import host_int64

if TYPE_CHECKING:
    from sglang.srt.multimodal.embedder import MultimodalEmbedder
    from sglang.srt.multimodal.mm_types import MultimodalInputs


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill, or a chunk of it, on top of an optional cached prefix
    DECODE = auto()  # one new token per request

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    """Built once per step by `build_forward_batch`: every device tensor below is a view into one
    buffer copied from the host in a single (pinned, non-blocking on CUDA) transfer (decode positions:
    one add over two such views), and every length the forward needs is also here as a host int, so
    nothing inside the model reads a device value."""

    forward_mode: ForwardMode
    input_ids: torch.Tensor  # (T,) flattened over requests; image tokens keep the image token id
    positions: torch.Tensor  # (3, T) M-RoPE positions (text tokens: the same value on all three rows; may be an expanded view)
    req_pool_indices: torch.Tensor  # (B,)
    seq_lens: torch.Tensor  # (B,) total tokens per request after this step
    out_cache_loc: torch.Tensor  # (T,) KV slots the new tokens are written to
    seq_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int] = field(default_factory=list)  # EXTEND only
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)  # EXTEND only
    req_pool_indices_cpu: list[int] = field(default_factory=list)
    qo_indptr: torch.Tensor | None = None  # (B+1,) start of each request's new tokens in the flat batch
    kv_indptr: torch.Tensor | None = None  # (B+1,) cumulative seq_lens
    last_indices: torch.Tensor | None = None  # (B,) flat index of each request's last new token
    max_seq_len: int = 0
    max_extend_len: int = 0
    mm_inputs: list["MultimodalInputs | None"] = field(default_factory=list)
    rids: list[str] = field(default_factory=list)  # one per request: keys the embedder's pending rows
    req_to_token_pool: Any = None
    token_to_kv_pool: Any = None
    attn_backend: Any = None
    return_all_logits: bool = False
    # prompt logprobs: flat rows whose hidden state scores the next prompt token, that token's id, and
    # how many top alternatives to return (None when no request of the batch asks)
    input_logprob_rows: torch.Tensor | None = None
    input_logprob_targets: torch.Tensor | None = None
    input_top_logprobs_num: int = 0
    mm_embedder: "MultimodalEmbedder | None" = None  # set by the model runner
    # hybrid models: per request, the recurrent states to keep as prefix-cache snapshots inside this step,
    # as (tokens into the step, state-pool slot); the model runner adds the slots' states (gdn_capture_states)
    gdn_captures: list[list[tuple[int, int]]] | None = None
    gdn_capture_states: list | None = None
    gdn_states: list | None = None  # hybrid models: each request's recurrent state (set by the model runner)
    # Stage timer (None when off): one dict per request, plus this batch's totals.
    stage_timings: list[dict] | None = None
    stage_totals: dict | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    def extend_start_locs(self) -> list[int]:
        starts, acc = [], 0
        for n in self.extend_seq_lens_cpu:
            starts.append(acc)
            acc += n
        return starts


def _cumsum0(xs: list[int]) -> list[int]:
    """[0, x0, x0 + x1, ...]: the running sum in C (no Python step per element)."""
    return list(accumulate(xs, initial=0))


def build_forward_batch(
    mode: ForwardMode,
    input_ids: list[int],
    positions: torch.Tensor | None,
    req_pool_indices: list[int],
    seq_lens: list[int],
    out_cache_loc: torch.Tensor,
    device: torch.device | str,
    extend_lens: list[int] | None = None,
    prefix_lens: list[int] | None = None,
    mrope_deltas: list[int] | None = None,
    **fields,
) -> ForwardBatch:
    """The one place a ForwardBatch is made (scheduler and static runner alike). `positions` (3, T)
    and `out_cache_loc` (T,) are host tensors; all per-step metadata is packed into one int64 host
    buffer and moved with one copy (pinned and non-blocking when the device is CUDA).

    DECODE may pass `positions=None` with each request's M-RoPE delta (`mrope_deltas`, host ints,
    default 0): the new token's position is then seq_len - 1 + delta, one vector op on the device
    over the whole batch (the same value on the three M-RoPE rows), as upstream computes it; no
    per-request host tensor is made."""
    device = torch.device(device)
    b, t = len(seq_lens), len(input_ids)
    if mode.is_extend():
        q_lens = list(extend_lens)
        qo_indptr = _cumsum0(q_lens)
        last_indices = [x - 1 for x in qo_indptr[1:]]
    else:  # one token per request: the prefix sums and last-token indices are plain ranges
        q_lens = [1] * b
        qo_indptr = list(range(b + 1))
        last_indices = list(range(b))
    if positions is None:
        if not mode.is_decode():
            raise ValueError("EXTEND batches need their positions (prompt tokens take the processor's)")
        pos_part = host_int64([d - 1 for d in mrope_deltas] if mrope_deltas else [-1] * b)
    else:
        pos_part = positions.to(torch.int64).reshape(-1)
    # the host lists become tensors through `array` (host_int64), not torch's per-element parsing
    parts = [
        host_int64(input_ids),
        pos_part,
        host_int64(req_pool_indices),
        host_int64(seq_lens),
        out_cache_loc.to(torch.int64).reshape(-1),
        host_int64(qo_indptr),
        host_int64(_cumsum0(seq_lens)),
        host_int64(last_indices),
    ]
    host = torch.cat(parts)
    if device.type == "cuda":
        host = host.pin_memory()
    dev = host.to(device, non_blocking=True)
    views = dev.split([p.numel() for p in parts])
    return ForwardBatch(
        forward_mode=mode,
        input_ids=views[0],
        positions=views[1].view(3, t) if positions is not None else (views[3] + views[1]).unsqueeze(0).expand(3, b),
        req_pool_indices=views[2],
        seq_lens=views[3],
        out_cache_loc=views[4],
        qo_indptr=views[5],
        kv_indptr=views[6],
        last_indices=views[7],
        seq_lens_cpu=list(seq_lens),
        extend_seq_lens_cpu=list(extend_lens or []),
        extend_prefix_lens_cpu=list(prefix_lens or []),
        req_pool_indices_cpu=list(req_pool_indices),
        max_seq_len=max(seq_lens, default=0),
        max_extend_len=max(q_lens, default=0),
        **fields,
    )


def mrope_delta(mm_inputs) -> int:
    """A request's M-RoPE position delta (0 for text): the token at index i past the prompt sits at
    position i + delta on all three rows."""
    return 0 if mm_inputs is None else int(mm_inputs.mrope_position_delta)


def compute_positions(mm_inputs, prompt_len: int, start: int, end: int) -> torch.Tensor:
    """(3, end-start) M-RoPE positions of a request's tokens [start, end). Prompt tokens take the
    processor's positions; later tokens (outputs, or outputs re-prefilled after a retraction)
    continue as text: index + the request's position delta."""
    delta = mrope_delta(mm_inputs)
    out = torch.arange(start, end, dtype=torch.int64).unsqueeze(0).repeat(3, 1) + delta
    if mm_inputs is not None and mm_inputs.mrope_positions is not None and start < prompt_len:
        stop = min(end, prompt_len)
        out[:, : stop - start] = torch.as_tensor(mm_inputs.mrope_positions)[:, start:stop]
    return out
