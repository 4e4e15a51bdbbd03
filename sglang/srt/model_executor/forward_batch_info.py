"""What one model forward needs to know about its batch: flattened tokens, positions, KV locations."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any

import torch

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
    forward_mode: ForwardMode
    input_ids: torch.Tensor  # (T,) flattened over requests; image tokens keep the image token id
    positions: torch.Tensor  # (3, T) M-RoPE positions, or (T,) for text-only models
    req_pool_indices: torch.Tensor  # (B,)
    seq_lens: torch.Tensor  # (B,) total tokens per request after this step
    out_cache_loc: torch.Tensor  # (T,) KV slots the new tokens are written to
    seq_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int] = field(default_factory=list)  # EXTEND only
    extend_prefix_lens_cpu: list[int] = field(default_factory=list)  # EXTEND only
    mm_inputs: list["MultimodalInputs | None"] = field(default_factory=list)
    rids: list[str] = field(default_factory=list)  # one per request: keys the embedder's pending rows
    req_to_token_pool: Any = None
    token_to_kv_pool: Any = None
    attn_backend: Any = None
    return_all_logits: bool = False
    mm_embedder: "MultimodalEmbedder | None" = None  # set by the model runner
    # Stage timer (None when off): one dict per request, plus this batch's totals.
    stage_timings: list[dict] | None = None
    stage_totals: dict | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    def last_token_indices(self) -> torch.Tensor:
        if self.forward_mode.is_decode():
            return torch.arange(self.batch_size, device=self.input_ids.device)
        lens = torch.tensor(self.extend_seq_lens_cpu, device=self.input_ids.device)
        return torch.cumsum(lens, 0) - 1

    def extend_start_locs(self) -> list[int]:
        starts, acc = [], 0
        for n in self.extend_seq_lens_cpu:
            starts.append(acc)
            acc += n
        return starts


def compute_positions(mm_inputs, prompt_len: int, start: int, end: int) -> torch.Tensor:
    """(3, end-start) M-RoPE positions of a request's tokens [start, end). Prompt tokens take the
    processor's positions; later tokens (outputs, or outputs re-prefilled after a retraction)
    continue as text: index + the request's position delta."""
    delta = 0 if mm_inputs is None else int(mm_inputs.mrope_position_delta)
    out = torch.arange(start, end, dtype=torch.int64).unsqueeze(0).repeat(3, 1) + delta
    if mm_inputs is not None and mm_inputs.mrope_positions is not None and start < prompt_len:
        stop = min(end, prompt_len)
        out[:, : stop - start] = torch.as_tensor(mm_inputs.mrope_positions)[:, start:stop]
    return out
