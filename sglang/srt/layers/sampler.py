"""Next-token sampling: greedy, temperature, top-k, top-p, min-p, with optional per-request seeds.

A seeded request draws from its own generator, so its tokens do not depend on what else is batched."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # (B, 1) float32; 0 means greedy
    top_ps: torch.Tensor  # (B,)
    top_ks: torch.Tensor  # (B,) int64; vocab size when disabled
    min_ps: torch.Tensor  # (B,)
    generators: list[torch.Generator | None]  # per row; None: the sampler's shared generator
    all_greedy: bool

    @classmethod
    def from_params(cls, params: list, generators: list, vocab_size: int, device) -> "SamplingBatchInfo":
        temps = [0.0 if p.is_greedy else float(p.temperature) for p in params]
        return cls(
            temperatures=torch.tensor(temps, dtype=torch.float32, device=device).unsqueeze(1),
            top_ps=torch.tensor([float(p.top_p) for p in params], dtype=torch.float32, device=device),
            top_ks=torch.tensor([vocab_size if p.top_k < 1 else min(p.top_k, vocab_size) for p in params], device=device),
            min_ps=torch.tensor([float(p.min_p) for p in params], dtype=torch.float32, device=device),
            generators=generators,
            all_greedy=all(t == 0.0 for t in temps),
        )


class Sampler:
    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        if info.all_greedy:
            return greedy
        probs = self._filtered_probs(logits.float(), info)
        out = greedy.clone()
        for i, g in enumerate(info.generators):
            if info.temperatures[i, 0].item() == 0.0:
                continue
            # NOTE: draws happen on the CPU so a seed gives the same tokens on every device
            row = probs[i].cpu()
            out[i] = torch.multinomial(row, 1, generator=g or self.generator).to(out.device)[0]
        return out

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
        temps = torch.where(info.temperatures == 0, torch.ones_like(info.temperatures), info.temperatures)
        probs = torch.softmax(logits / temps, dim=-1)
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(sorted_p.shape[-1], device=probs.device).unsqueeze(0)
        keep = ranks < info.top_ks.unsqueeze(1)
        cum = sorted_p.cumsum(dim=-1)
        keep &= (cum - sorted_p) < info.top_ps.unsqueeze(1)  # always keeps the top token
        keep &= sorted_p >= sorted_p[:, :1] * info.min_ps.unsqueeze(1)
        sorted_p = sorted_p * keep
        filtered = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        return filtered / filtered.sum(dim=-1, keepdim=True)
