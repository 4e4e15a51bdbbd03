"""Scheduler-side request state (`Req`) and the batch of requests one forward step runs."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from operator import add, attrgetter, is_, itemgetter

import torch

from sglang.srt.managers.io_struct import FinishReason
from sglang.srt.model_executor.forward_batch_info import (
    ForwardBatch,
    ForwardMode,
    build_forward_batch,
    compute_positions,
    mrope_delta,
)
from sglang.srt.multimodal.mm_types import MultimodalInputs
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.utils.host_tensors import host_int64


class Req:
    """One request inside the scheduler.

    Token bookkeeping: `fill_ids` is the prompt key (image tokens replaced by pad values) followed by
    the generated tokens; the first `kv_len` of them have KV in the pool at the slots in
    `kv_indices` (the cached prefix owned by the radix tree comes first, `cache_len` long)."""

    def __init__(
        self,
        rid: str,
        origin_input_ids: list[int],
        sampling_params: SamplingParams,
        mm_inputs: MultimodalInputs | None = None,
        stream: bool = False,
        created_time: float | None = None,
        stage_timings_ms: dict | None = None,
    ):
        self.rid = rid
        self.origin_input_ids = origin_input_ids
        self.sampling_params = sampling_params
        self.mm_inputs = mm_inputs
        self.stream = stream
        self.created_time = created_time or time.time()
        self.stage_timings_ms = dict(stage_timings_ms or {})
        self.prompt_key: list[int] = list(origin_input_ids)  # set to the padded key after hashing
        self.output_ids: list[int] = []
        # filled only when the request asks for logprobs: one entry per output token
        self.output_token_logprobs: list[tuple[float, int]] = []
        self.output_top_logprobs: list[list[tuple[float, int]]] = []
        # prompt logprobs (sampling_params.wants_input_logprobs): one entry per prompt position from
        # input_logprob_start on, written by position, so a chunk run twice (re-prefill after a
        # retraction) overwrites instead of appending; the first prompt token keeps logprob None
        self.input_logprob_start: int | None = None
        self.input_token_logprobs: list[tuple[float | None, int]] = []
        self.input_top_logprobs: list[list[tuple[float, int]] | None] = []
        self.input_logprobs_sent = False
        if sampling_params.wants_input_logprobs:
            self.input_logprob_start = min(sampling_params.logprob_start_len, len(origin_input_ids))
            self.input_token_logprobs = [(None, t) for t in origin_input_ids[self.input_logprob_start:]]
            self.input_top_logprobs = [None] * len(self.input_token_logprobs)
        self.finished_reason: FinishReason | None = None
        self.to_abort: FinishReason | None = None
        # --enable-priority-scheduling: larger runs first (smaller with --schedule-low-priority-values-first)
        self.priority = 0
        # constrained output: the request's grammar matcher (sglang/srt/constrained/matcher.py), set when
        # its grammar has compiled on this rank; it has accepted exactly output_ids
        self.grammar = None
        self.grammar_start_after: int | None = None  # the grammar starts after this output token (reasoning)
        # the client's processor string (sampling/custom_logit_processor.py), run on this request's logits row
        self.custom_logit_processor: str | None = None

        self.req_pool_idx: int = -1
        self._kv_slots: list[int] = []  # decode slots appended since kv_indices was last read
        self.kv_indices = torch.empty(0, dtype=torch.int64)
        self.last_node = None  # radix node locked for this request's cached prefix
        self.cache_len = 0  # tokens of kv_indices owned by the radix tree
        self.cached_tokens = 0  # prefix-cache hit reported to the client (first admission)
        self.admitted = False
        self.extend_len = 0  # tokens this step prefills
        self.sent_len = 0  # output tokens already sent to the detokenizer
        self.kv_cacheable = True  # False: computed from a stand-in input (an undecodable image), never cached
        # hybrid models: (position, state-pool slot) snapshots captured in this admission's prefill steps,
        # given to the prefix cache (or freed) when the request is released
        self.state_snapshots: list[tuple[int, int]] = []
        self.tp_broadcast_ms = 0.0
        self.upstream_stages: frozenset[str] = frozenset()  # stage timings measured before the scheduler
        # what its sampling params (fixed once it is scheduled) decide, made at first use so that a decode
        # step reads them with C-level passes: the worker's sampling row (layers/sampler.py `sampling_row`)
        # and the scheduler's finish rule (scheduler_output_processor_mixin.py `_finish_rules`)
        self._sampling_row: tuple | None = None
        self._finish_rule: tuple | None = None

    # ------------------------------------------------------------------ views
    @property
    def fill_ids(self) -> list[int]:
        return self.prompt_key + self.output_ids

    @property
    def kv_indices(self) -> torch.Tensor:
        """KV slots of fill_ids[:kv_len] (host int64). Decode slots appended one step at a time (as ints,
        `append_decode_slots`) are joined only when this is read (release, paged extend), not at every step."""
        if self._kv_slots:
            self._kv_indices = torch.cat([self._kv_indices, host_int64(self._kv_slots)])
            self._kv_joined += len(self._kv_slots)
            self._kv_slots = []
        return self._kv_indices

    @kv_indices.setter
    def kv_indices(self, value: torch.Tensor) -> None:
        self._kv_indices = value
        self._kv_slots = []
        self._kv_joined = int(value.numel())  # kv_len = _kv_joined + len(_kv_slots)

    @property
    def kv_len(self) -> int:
        return self._kv_joined + len(self._kv_slots)

    @property
    def prompt_len(self) -> int:
        return len(self.origin_input_ids)

    def owes_input_logprobs(self) -> bool:
        """Prompt logprobs asked and the prompt not yet fully prefilled once."""
        return self.input_logprob_start is not None and not self.output_ids

    def prefix_key(self) -> list[int]:
        """What the prefix cache may serve: all of fill_ids but the last token, and while prompt logprobs
        are owed, nothing from the position before the first one asked (its hidden state gives that
        token's logprob, so it must run through the model)."""
        limit = len(self.fill_ids) - 1
        if self.owes_input_logprobs():
            limit = min(limit, max(self.input_logprob_start - 1, 0))
        return self.fill_ids[:limit]

    def input_logprob_positions(self, start: int, end: int) -> range:
        """Positions q in [start, end) whose hidden state scores prompt token q + 1 (owed, asked for)."""
        if not self.owes_input_logprobs():
            return range(0)
        return range(max(start, self.input_logprob_start - 1, 0), min(end, self.prompt_len - 1))

    def is_prefilling(self) -> bool:
        """True while part of fill_ids (minus the newest token during decode) lacks KV."""
        return self.kv_len < len(self.fill_ids) - (1 if self.output_ids else 0)

    def finished(self) -> bool:
        return self.finished_reason is not None

    def model_input_ids(self, start: int, end: int) -> list[int]:
        """Token ids fed to the model: real ids (image tokens keep the image token id; the embedding
        routine finds images by offsets, never by value)."""
        return (self.origin_input_ids + self.output_ids)[start:end]

    def positions(self, start: int, end: int) -> torch.Tensor:
        return compute_positions(self.mm_inputs, self.prompt_len, start, end)

    def remaining_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens - len(self.output_ids)

    def __repr__(self) -> str:
        return f"Req(rid={self.rid}, kv={self.kv_len}, fill={len(self.fill_ids)}, out={len(self.output_ids)})"


_OUTPUT_IDS, _MM_INPUTS = attrgetter("output_ids"), attrgetter("mm_inputs")
_REQ_POOL_IDX, _RID, _LAST = attrgetter("req_pool_idx"), attrgetter("rid"), itemgetter(-1)
_KV_JOINED, _KV_SLOTS = attrgetter("_kv_joined"), attrgetter("_kv_slots")


# Batch-level reads and writes of the requests' KV bookkeeping for a decode step: C-level maps, no Python frame
# per request (a property or method call would be one each)
def kv_lens(reqs: list[Req]) -> list[int]:
    """Each request's kv_len."""
    return list(map(add, map(_KV_JOINED, reqs), map(len, map(_KV_SLOTS, reqs))))


def req_pool_indices(reqs: list[Req]) -> list[int]:
    return list(map(_REQ_POOL_IDX, reqs))


def all_none(values) -> bool:
    """Whether every value is None (identity, as `is None` per item), in C: a decode step's "does any request
    need X" scan."""
    return all(map(is_, values, repeat(None)))


def append_decode_slots(reqs: list[Req], slots: list[int]) -> None:
    """Request i's next KV slot is slots[i] (already queued for its request-table row)."""
    deque(map(list.append, map(_KV_SLOTS, reqs), slots), maxlen=0)


@dataclass
class ScheduleBatch:
    """Requests run together in one forward step, with what each contributes."""

    mode: ForwardMode
    reqs: list[Req]
    extend_lens: list[int] = field(default_factory=list)  # EXTEND: tokens per request this step
    prefix_lens: list[int] = field(default_factory=list)  # EXTEND: KV already present per request
    out_cache_loc: torch.Tensor | None = None
    # EXTEND with prompt logprobs owed: (request index, prompt position scored) per scored row, in
    # the order of the forward's input_logprobs; set by to_forward_batch
    input_logprob_owners: list[tuple[int, int]] = field(default_factory=list)
    seq: int = 0  # the scheduler's step number
    # overlap scheduling, DECODE: rows whose input token the previous batch (step `future_seq`) is still
    # sampling, as (row, row in that batch); the worker fills them on the device
    future_rows: list[tuple[int, int]] | None = None
    future_seq: int = -1
    # hybrid models, EXTEND: per request, (tokens into this step, snapshot slot) states to keep (hybrid_prefix.py)
    gdn_captures: list[list[tuple[int, int]]] | None = None

    def is_empty(self) -> bool:
        return not self.reqs

    def to_forward_batch(self, device, stage_timer_on: bool = False) -> ForwardBatch:
        ids: list[int] = []
        seq_lens: list[int] = []
        rows: list[int] = []
        positions: torch.Tensor | None = None
        deltas: list[int] | None = None
        self.input_logprob_owners = []
        if self.mode.is_extend():
            pos: list[torch.Tensor] = []
            for i, (r, pre, n) in enumerate(zip(self.reqs, self.prefix_lens, self.extend_lens)):
                for q in r.input_logprob_positions(pre, pre + n):
                    rows.append(len(ids) + q - pre)
                    self.input_logprob_owners.append((i, q + 1))
                ids += r.model_input_ids(pre, pre + n)
                pos.append(r.positions(pre, pre + n))
                seq_lens.append(pre + n)
            positions = torch.cat(pos, dim=1)
        else:  # host ints only: positions are seq_len - 1 + delta, made on the device
            # per-request reads as C-level maps (no Python frame per request): a decode step's hot loop
            reqs = self.reqs
            ids = list(map(_LAST, map(_OUTPUT_IDS, reqs)))
            seq_lens = kv_lens(reqs)  # the new token's KV slot is already appended
            mm = list(map(_MM_INPUTS, reqs))
            # text-only batch: every delta is 0, which build_forward_batch assumes when given none
            deltas = None if all_none(mm) else [mrope_delta(m) for m in mm]
        return build_forward_batch(
            self.mode, ids, positions, req_pool_indices(self.reqs), seq_lens,
            self.out_cache_loc, device, self.extend_lens, self.prefix_lens, mrope_deltas=deltas,
            mm_inputs=[r.mm_inputs for r in self.reqs] if self.mode.is_extend() else [],
            rids=list(map(_RID, self.reqs)),
            stage_timings=[r.stage_timings_ms for r in self.reqs] if stage_timer_on else None,
            stage_totals={} if stage_timer_on else None,
            gdn_captures=self.gdn_captures if self.mode.is_extend() else None,
            **(self._input_logprob_fields(rows, device) if rows else {}),
        )

    def _input_logprob_fields(self, rows: list[int], device) -> dict:
        targets = [self.reqs[i].origin_input_ids[p] for i, p in self.input_logprob_owners]
        idx = torch.tensor([rows, targets], dtype=torch.int64).to(device)
        top_n = max(self.reqs[i].sampling_params.top_logprobs_num for i, _ in self.input_logprob_owners)
        return {"input_logprob_rows": idx[0], "input_logprob_targets": idx[1], "input_top_logprobs_num": top_n}
