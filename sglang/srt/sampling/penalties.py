"""Repetition, frequency and presence penalties with their token statistics kept on the device.

`PenaltyState` (one per TP worker) holds a row per request that has a penalty:
- `counts` (rows, V) float32: occurrences of each token in the request's output so far;
- `prompt_seen` (rows, V) bool: tokens of the prompt (marked only when repetition_penalty != 1);
- `params` (rows, 3) float32: (repetition, frequency, presence).
Row 0 is all zeros / (1, 0, 0): rows of the batch without a penalty read it and come out unchanged.

A row is built once, when its request first reaches a step (prompt marks, and the output so far: a
request re-prefilled after a retraction brings its outputs back); after that each step scatters only
the output tokens appended since the request's previous step (normally one per request), all rows
in one `index_put_(accumulate=True)`. The new tokens are read from the requests' own output lists,
so whatever the scheduler did with a sampled token (kept, discarded for a re-prefill, never asked
for in a middle prefill chunk) the counts follow what the request holds. Nothing per token of the
prompt or output is rebuilt from Python per step: the host packs B row indices plus the new tokens
into one int64 tensor and copies it once.

Rows are freed when the request finishes or aborts (`release`, from `TpModelWorker.release_request`)
or is retracted (`TpModelWorker.forget_retracted`), and reused; the tables grow (doubling) when no
row is free. Every TP rank runs the same steps and releases, so their tables stay identical.

The adjustment is the one the per-step rebuild (`RebuiltPenaltyState`, the sampler's former
`Penalties`) makes, op for op, so the adjusted logits are bitwise the same: HF repetition (divide positive logits, multiply negative ones,
for every token seen in prompt or output), then OpenAI frequency (per output occurrence) and
presence (once per token present in the output)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import compress, repeat
from operator import add, attrgetter, is_, is_not, itemgetter, not_
from typing import Any

import torch

from sglang.srt.utils.host_tensors import host_int64

_ZERO_ROW = 0
_PARAMS, _HAS_PENALTY = attrgetter("sampling_params"), attrgetter("has_penalty")
_RID, _OUTPUT_IDS, _LAST = attrgetter("rid"), attrgetter("output_ids"), itemgetter(-1)
_REQ, _COUNTED, _INDEX = attrgetter("req"), attrgetter("counted"), attrgetter("index")


@dataclass
class _Row:
    index: int
    req: Any  # the request object the row was built for: another object under the same rid is rebuilt
    counted: int  # output tokens already scattered into counts


@dataclass
class PenaltyBatch:
    """One step's view of the state: the row of each request of the batch, on the device."""

    rows: torch.Tensor  # (B,) int64


class PenaltyState:
    def __init__(self, vocab_size: int, device: torch.device | str, initial_rows: int = 8):
        self.vocab = vocab_size
        self.device = torch.device(device)
        self.initial_rows = max(2, initial_rows)
        self.capacity = 0  # rows allocated (row 0 included); tables made on the first penalized request
        self.counts: torch.Tensor | None = None
        self.prompt_seen: torch.Tensor | None = None
        self.params: torch.Tensor | None = None
        self._free: list[int] = []
        self._rows: dict[str, _Row] = {}
        self._one = torch.ones((), dtype=torch.float32, device=self.device)
        self._true = torch.ones((), dtype=torch.bool, device=self.device)

    # ------------------------------------------------------------------ rows
    @property
    def rows_in_use(self) -> int:
        return len(self._rows)

    def row_of(self, rid: str) -> int | None:
        row = self._rows.get(rid)
        return None if row is None else row.index

    def release(self, rid: str) -> None:
        """The request is gone (finished, aborted) or retracted: its row is free for another."""
        row = self._rows.pop(rid, None)
        if row is not None:
            self._free.append(row.index)

    def _grow(self, need: int) -> None:
        new_cap = max(self.initial_rows, 2 * self.capacity, self.capacity + need)
        counts = torch.zeros(new_cap, self.vocab, dtype=torch.float32, device=self.device)
        seen = torch.zeros(new_cap, self.vocab, dtype=torch.bool, device=self.device)
        params = torch.zeros(new_cap, 3, dtype=torch.float32, device=self.device)
        params[:, 0] = 1.0
        if self.capacity:
            counts[: self.capacity] = self.counts
            seen[: self.capacity] = self.prompt_seen
            params[: self.capacity] = self.params
        first = max(self.capacity, _ZERO_ROW + 1)
        # lowest rows first out: pop() from the end
        self._free = list(range(new_cap - 1, first - 1, -1)) + self._free
        self.counts, self.prompt_seen, self.params, self.capacity = counts, seen, params, new_cap

    def _take_row(self) -> int:
        if not self._free:
            self._grow(1)
        return self._free.pop()

    # ------------------------------------------------------------------ per step
    def prepare(self, reqs: list) -> PenaltyBatch | None:
        """Before sampling a step of `reqs` (objects with rid, sampling_params, origin_input_ids and
        output_ids): rows for requests new to the state, the tokens appended since each request's
        last step scattered into its counts. None when no request of the batch has a penalty."""
        penalized = list(map(_HAS_PENALTY, map(_PARAMS, reqs)))  # one property call per request, no loop frame
        if not any(penalized):
            return None
        usual = self._usual_decode_step(reqs, penalized)
        if usual is not None:  # no new rows, no prompt marks
            batch_rows, count_rows, count_ids = usual
            new_rows, new_params, seen_rows, seen_ids = [], [], [], []
        else:
            batch_rows, new_rows, new_params, count_rows, count_ids, seen_rows, seen_ids = \
                self._per_request(reqs, penalized)
        host = host_int64(batch_rows + new_rows + count_rows + count_ids + seen_rows + seen_ids)
        if self.device.type == "cuda":
            host = host.pin_memory()
        dev = host.to(self.device, non_blocking=True)
        b, k, n, m = len(batch_rows), len(new_rows), len(count_rows), len(seen_rows)
        rows, new_idx, c_rows, c_ids, s_rows, s_ids = dev.split([b, k, n, n, m, m])
        if k:
            self.counts.index_fill_(0, new_idx, 0.0)
            self.prompt_seen.index_fill_(0, new_idx, False)
            vals = torch.tensor(new_params, dtype=torch.float32).to(self.device, non_blocking=True)
            self.params.index_copy_(0, new_idx, vals)
        if n:
            self.counts.index_put_((c_rows, c_ids), self._one.expand(n), accumulate=True)
        if m:
            self.prompt_seen.index_put_((s_rows, s_ids), self._true.expand(m))
        return PenaltyBatch(rows)

    def _per_request(self, reqs: list, penalized: list[bool]) -> tuple[list, ...]:
        """Any step, one request at a time: (each request's row, new rows, their params, rows and ids to
        count, rows and ids of prompt tokens to mark)."""
        vocab = self.vocab
        batch_rows: list[int] = []
        new_rows: list[int] = []
        new_params: list[list[float]] = []
        count_rows: list[int] = []
        count_ids: list[int] = []
        seen_rows: list[int] = []
        seen_ids: list[int] = []
        rows_of = self._rows
        for r, has_penalty in zip(reqs, penalized):
            if not has_penalty:
                batch_rows.append(_ZERO_ROW)
                continue
            p = r.sampling_params
            entry = rows_of.get(r.rid)
            out = r.output_ids
            if entry is not None and entry.req is r and len(out) == entry.counted + 1:
                # this request's row, one token appended since its last step (a step some other request joins)
                t = out[-1]
                if 0 <= t < vocab:
                    count_rows.append(entry.index)
                    count_ids.append(t)
                entry.counted += 1
                batch_rows.append(entry.index)
                continue
            if entry is None or entry.req is not r or len(out) < entry.counted:
                if entry is not None:
                    self.release(r.rid)
                entry = _Row(self._take_row(), r, 0)
                self._rows[r.rid] = entry
                new_rows.append(entry.index)
                new_params.append([float(p.repetition_penalty), float(p.frequency_penalty), float(p.presence_penalty)])
                if p.repetition_penalty != 1.0:
                    prompt = [t for t in r.origin_input_ids if 0 <= t < vocab]
                    seen_rows += [entry.index] * len(prompt)
                    seen_ids += prompt
            if len(out) > entry.counted:
                new = [t for t in out[entry.counted:] if 0 <= t < vocab]
                count_rows += [entry.index] * len(new)
                count_ids += new
                entry.counted = len(out)
            batch_rows.append(entry.index)
        return batch_rows, new_rows, new_params, count_rows, count_ids, seen_rows, seen_ids

    def _usual_decode_step(self, reqs: list, penalized: list[bool]) -> tuple[list, list, list] | None:
        """The usual decode step, in C-level passes over the batch (no Python frame per request): every
        penalized request has its row, built for this very request object, and exactly one token appended
        since its last step, inside the vocabulary; the other requests have no row. Then: (each request's
        row, rows and ids to count), every counted length advanced by one; else None and nothing changed
        (the per-request loop handles the step)."""
        entries = list(map(self._rows.get, map(_RID, reqs)))
        mine = list(compress(entries, penalized))
        if not all(map(is_not, mine, repeat(None))):
            return None
        if len(mine) != len(entries) and not all(map(is_, compress(entries, map(not_, penalized)), repeat(None))):
            return None
        owners = list(compress(reqs, penalized))
        if not all(map(is_, map(_REQ, mine), owners)):
            return None
        outputs = list(map(_OUTPUT_IDS, owners))
        lens = list(map(len, outputs))
        if lens != list(map(add, map(_COUNTED, mine), repeat(1))):
            return None
        new = list(map(_LAST, outputs))
        if min(new) < 0 or max(new) >= self.vocab:
            return None
        deque(map(setattr, mine, repeat("counted"), lens), maxlen=0)
        return list(map(getattr, entries, repeat("index"), repeat(_ZERO_ROW))), list(map(_INDEX, mine)), new

    def apply(self, logits: torch.Tensor, batch: PenaltyBatch) -> torch.Tensor:
        """(B, V) logits with the batch's penalties applied (a new tensor; `logits` is untouched)."""
        counts = self.counts.index_select(0, batch.rows)
        present = counts > 0
        seen = self.prompt_seen.index_select(0, batch.rows).logical_or_(present)
        params = self.params.index_select(0, batch.rows)
        repetition, frequency, presence = params[:, 0:1], params[:, 1:2], params[:, 2:3]
        rep = torch.where(seen, repetition, torch.ones_like(repetition))
        logits = torch.where(logits > 0, logits / rep, logits * rep)
        return logits - frequency * counts - presence * present.float()


@dataclass
class RebuiltPenalties:
    rows: None
    repetition: torch.Tensor  # (B, 1)
    frequency: torch.Tensor  # (B, 1)
    presence: torch.Tensor  # (B, 1)
    output_counts: torch.Tensor  # (B, V) float32
    seen: torch.Tensor  # (B, V) bool


class RebuiltPenaltyState:
    """The per-step rebuild this module replaces (the sampler's former `Penalties.build`): every row's
    prompt and output flattened in Python and copied to the device at every step. Same interface as
    `PenaltyState`; kept as the reference the device state is tested against and as the benchmark's
    `--legacy-penalties` baseline. Not for serving."""

    def __init__(self, vocab_size: int, device: torch.device | str, initial_rows: int = 8):
        self.vocab = vocab_size
        self.device = torch.device(device)

    rows_in_use = 0

    def row_of(self, rid: str) -> None:
        return None

    def release(self, rid: str) -> None:
        pass

    def prepare(self, reqs: list) -> RebuiltPenalties | None:
        params = [r.sampling_params for r in reqs]
        if not any(p.has_penalty for p in params):
            return None
        vocab, device = self.vocab, self.device

        def flat(seqs):
            rows = [i for i, seq in enumerate(seqs) for t in seq if 0 <= t < vocab]
            ids = [t for seq in seqs for t in seq if 0 <= t < vocab]
            return torch.tensor([rows, ids], dtype=torch.int64).to(device, non_blocking=True)

        out_idx = flat([r.output_ids for r in reqs])
        counts = torch.zeros(len(reqs), vocab, dtype=torch.float32, device=device)
        counts.index_put_((out_idx[0], out_idx[1]), torch.ones(out_idx.shape[1], device=device), accumulate=True)
        seen = counts > 0
        prompt_idx = flat([r.origin_input_ids if p.repetition_penalty != 1.0 else [] for r, p in zip(reqs, params)])
        seen[prompt_idx[0], prompt_idx[1]] = True
        vals = torch.tensor([[p.repetition_penalty, p.frequency_penalty, p.presence_penalty] for p in params],
                            dtype=torch.float32).to(device, non_blocking=True)
        return RebuiltPenalties(None, vals[:, 0:1], vals[:, 1:2], vals[:, 2:3], counts, seen)

    def apply(self, logits: torch.Tensor, b: RebuiltPenalties) -> torch.Tensor:
        rep = torch.where(b.seen, b.repetition, torch.ones_like(b.repetition))
        logits = torch.where(logits > 0, logits / rep, logits * rep)
        return logits - b.frequency * b.output_counts - b.presence * (b.output_counts > 0).float()
