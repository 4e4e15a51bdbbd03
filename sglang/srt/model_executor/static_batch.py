"""A fixed batch run to completion without a scheduler: prefill (optionally chunked) then greedy or
sampled decode. Used by `sglang.bench_one_batch` and by the model parity tests; the serving
scheduler builds the same ForwardBatch objects from its running queue."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from sglang.srt.model_executor.forward_batch_info import (
    ForwardBatch,
    ForwardMode,
    build_forward_batch,
    compute_positions,
    mrope_delta,
)


_seq_ids = itertools.count()


@dataclass
class StaticSeq:
    input_ids: list[int]
    mm_inputs: object | None = None  # MultimodalInputs
    req_pool_idx: int = -1
    kv_len: int = 0
    output_ids: list[int] = field(default_factory=list)
    slots: list[torch.Tensor] = field(default_factory=list)
    rid: str = field(default_factory=lambda: f"static-{next(_seq_ids)}")

    def positions(self, start: int, end: int) -> torch.Tensor:
        return compute_positions(self.mm_inputs, len(self.input_ids), start, end)


class StaticBatchRunner:
    def __init__(self, model_runner):
        self.runner = model_runner

    def _admit(self, seqs: list[StaticSeq]) -> None:
        for s in seqs:
            if s.req_pool_idx < 0:
                idx = self.runner.req_to_token_pool.alloc()
                if idx is None:
                    raise RuntimeError("no free request slot")
                s.req_pool_idx = idx

    def _alloc(self, s: StaticSeq, n: int) -> torch.Tensor:
        loc = self.runner.allocator.alloc(n)
        if loc is None:
            raise RuntimeError(f"KV pool exhausted: need {n} slots, {self.runner.allocator.available_size()} free")
        self.runner.req_to_token_pool.write(s.req_pool_idx, s.kv_len, loc)
        s.slots.append(loc)
        return loc

    def extend(self, seqs: list[StaticSeq], chunk_size: int | None = None, return_all_logits: bool = False):
        """Prefills every sequence's prompt. Returns (next-token logits (B, V), per-sequence logits
        of all prompt positions when `return_all_logits`)."""
        self._admit(seqs)
        full: list[list[torch.Tensor]] = [[] for _ in seqs]
        last: list[torch.Tensor | None] = [None] * len(seqs)
        while True:
            active = [(i, s) for i, s in enumerate(seqs) if s.kv_len < len(s.input_ids)]
            if not active:
                break
            ids, pos, locs, ext, pre, seq_lens = [], [], [], [], [], []
            for _, s in active:
                n = len(s.input_ids) - s.kv_len
                n = min(n, chunk_size) if chunk_size else n
                locs.append(self._alloc(s, n))
                ids.extend(s.input_ids[s.kv_len : s.kv_len + n])
                pos.append(s.positions(s.kv_len, s.kv_len + n))
                ext.append(n)
                pre.append(s.kv_len)
                seq_lens.append(s.kv_len + n)
            fb = self._batch(ForwardMode.EXTEND, [s for _, s in active], ids, pos, locs, seq_lens, ext, pre)
            fb.return_all_logits = return_all_logits
            out = self.runner.forward(fb)
            start = 0
            for j, (i, s) in enumerate(active):
                s.kv_len += ext[j]
                last[i] = out.next_token_logits[j]
                if return_all_logits:
                    full[i].append(out.full_logits[start : start + ext[j]])
                start += ext[j]
        logits = torch.stack(last)
        return logits, ([torch.cat(f) for f in full] if return_all_logits else None)

    def decode(self, seqs: list[StaticSeq], tokens: list[int]) -> torch.Tensor:
        return self.runner.forward(self.decode_batch(seqs, tokens)).next_token_logits

    def decode_batch(self, seqs: list[StaticSeq], tokens: list[int]) -> ForwardBatch:
        """Appends each token's KV slot and returns the decode step's batch (not yet run). The batch's
        slots come from one allocation; positions are made on the device from the sequence lengths
        and M-RoPE deltas (host ints), so the step makes no tensor per sequence beyond its table write."""
        if self.runner.allocator.page_size != 1:  # a fresh page per sequence: one allocation each
            locs = torch.cat([self._alloc(s, 1) for s in seqs])
        else:
            locs = self.runner.allocator.alloc(len(seqs))
            if locs is None:
                raise RuntimeError(f"KV pool exhausted: need {len(seqs)} slots, "
                                   f"{self.runner.allocator.available_size()} free")
            pool = self.runner.req_to_token_pool
            for s, loc in zip(seqs, locs.split(1)):
                pool.write(s.req_pool_idx, s.kv_len, loc)
                s.slots.append(loc)
        seq_lens = []
        for s in seqs:
            s.kv_len += 1
            seq_lens.append(s.kv_len)
        return build_forward_batch(
            ForwardMode.DECODE, list(tokens), None, [s.req_pool_idx for s in seqs], seq_lens, locs,
            self.runner.device, mrope_deltas=[mrope_delta(s.mm_inputs) for s in seqs], rids=[s.rid for s in seqs],
        )

    def generate_greedy(self, seqs: list[StaticSeq], max_new_tokens: int, chunk_size: int | None = None,
                        stop_ids: tuple[int, ...] = ()) -> list[list[int]]:
        logits, _ = self.extend(seqs, chunk_size)
        live = list(range(len(seqs)))
        for step in range(max_new_tokens):
            nxt = logits.argmax(-1).tolist()
            still = []
            for j, i in enumerate(live):
                seqs[i].output_ids.append(nxt[j])
                if nxt[j] not in stop_ids:
                    still.append((i, nxt[j]))
            live = [i for i, _ in still]
            if not live or step == max_new_tokens - 1:
                break
            logits = self.decode([seqs[i] for i in live], [t for _, t in still])
        return [s.output_ids for s in seqs]

    def release(self, seqs: list[StaticSeq]) -> None:
        slots = [loc for s in seqs for loc in s.slots]
        if slots:
            self.runner.allocator.free(torch.cat(slots))  # one free (and one unique) for the whole batch
        for s in seqs:
            s.slots.clear()
            if s.req_pool_idx >= 0:
                self.runner.req_to_token_pool.free(s.req_pool_idx)
                s.req_pool_idx = -1
            self.runner.mm_embedder.release(s.rid)

    def _batch(self, mode, seqs, ids, pos, locs, seq_lens, ext=None, pre=None) -> ForwardBatch:
        return build_forward_batch(
            mode, ids, torch.cat(pos, dim=1), [s.req_pool_idx for s in seqs], seq_lens, torch.cat(locs).cpu(),
            self.runner.device, ext, pre,
            mm_inputs=[s.mm_inputs for s in seqs] if mode.is_extend() else [],
            rids=[s.rid for s in seqs],
        )
