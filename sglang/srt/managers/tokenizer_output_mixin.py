"""What comes back to the tokenizer manager from the detokenizer: each waiting request's state, the
receive loop that routes `BatchStrOut`s (and control replies) to it, and the stream chunks and final
outputs built from that state. `TokenizerManager` (tokenizer_manager.py) mixes this in."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import (
    BatchStrOut,
    FinishReason,
    FlushCacheReqOutput,
    GetLoadReqOutput,
    GetServerInfoReqOutput,
    ProfileReqOutput,
    UpdateWeightFromDiskReqOutput,
)
from sglang.srt.managers.stop_holdback import StopHoldback
from sglang.srt.metrics.stage_timer import rounded

logger = logging.getLogger(__name__)


@dataclass
class _ReqState:
    rid: str
    stream: bool
    holdback: StopHoldback | None  # streams hold back what may become a stop match (None with no_stop_trim)
    created_time: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    meta_info: dict[str, Any] = field(default_factory=dict)
    finished_reason: FinishReason | None = None
    error: GenerateError | None = None
    sent_text_len: int = 0
    sent_ids_len: int = 0
    stage_timings: dict[str, float] = field(default_factory=dict)  # measured in this process
    logprob_text: bool = False  # logprob entries carry the token's text (return_text_in_logprobs)
    last_output_time: float = 0.0


class TokenizerOutputMixin:
    """Needs from its host: ids_only, rid_to_state, tokenizer, metrics, has_served, mark_dead, _recv_sock,
    _resolve_control (tokenizer_communicator_mixin.py), weight_version and _request_ended
    (tokenizer_update_weights_mixin.py)."""

    weight_version = "default"  # the host's current one is reported in every meta_info

    async def _handle_loop(self) -> None:
        try:
            while True:
                msg = await self._recv_sock.recv_pyobj()
                if isinstance(msg, BatchStrOut):
                    self._handle_batch_str_out(msg)
                elif isinstance(msg, (FlushCacheReqOutput, GetServerInfoReqOutput, ProfileReqOutput, GetLoadReqOutput,
                                      UpdateWeightFromDiskReqOutput)):
                    self._resolve_control(msg)
                else:
                    logger.warning("tokenizer manager: ignoring unexpected message %s", type(msg).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # Without this loop nothing is ever answered again: fail loudly instead of hanging.
            logger.exception("tokenizer manager receive loop failed")
            self.mark_dead(f"receive loop failed: {type(e).__name__}: {e}")

    def _handle_batch_str_out(self, msg: BatchStrOut) -> None:
        self.has_served = True
        for i, rid in enumerate(msg.rids):
            state = self.rid_to_state.get(rid)
            if state is None:  # aborted or already failed
                continue
            state.text += msg.output_strs[i]
            if self.metrics is not None:
                self._observe(state, len(msg.new_token_ids[i]))
            state.output_ids.extend(msg.new_token_ids[i])
            if i < len(msg.meta_info) and msg.meta_info[i]:
                meta = dict(msg.meta_info[i])
                self._convert_logprobs(state, meta)
                state.meta_info.update(meta)
            state.meta_info["prompt_tokens"] = msg.prompt_tokens[i]
            state.meta_info["completion_tokens"] = msg.completion_tokens[i]
            state.meta_info["cached_tokens"] = msg.cached_tokens[i]
            if msg.finished_reasons[i] is not None:
                state.finished_reason = msg.finished_reasons[i]
                del self.rid_to_state[rid]
                # over for a weight update's drain now, not once its caller has read it (an unread stream
                # must not hold an update, and every request behind it, without end)
                self._request_ended(state)
                if self.metrics is not None:
                    meta = self._meta(state)
                    self.metrics.observe_finished(meta["e2e_latency"], meta, state.finished_reason.type)
            state.event.set()

    def _convert_logprobs(self, state: _ReqState, meta: dict[str, Any]) -> None:
        """The scheduler's (logprob, token id) pairs in upstream's layout, [logprob, token id, text or
        None], in place in `meta`; output positions arrive as deltas and accumulate on `state`."""
        if "output_token_logprobs_delta" not in meta and "input_token_logprobs" not in meta:
            return  # every output message passes here; most ask for no logprobs

        def entry(lp, tok):
            return [lp, tok, self.builder.lanes.decode_output([tok]) if state.logprob_text else None]

        def alternatives(alts):
            return None if alts is None else [entry(lp, tok) for lp, tok in alts]

        if "output_token_logprobs_delta" in meta:
            state.meta_info.setdefault("output_token_logprobs", []).extend(
                entry(lp, tok) for lp, tok in meta.pop("output_token_logprobs_delta"))
            state.meta_info.setdefault("output_top_logprobs", []).extend(
                alternatives(alts) for alts in meta.pop("output_top_logprobs_delta"))
        if "input_token_logprobs" in meta:
            meta["input_token_logprobs"] = [entry(lp, tok) for lp, tok in meta["input_token_logprobs"]]
        if "input_top_logprobs" in meta:
            meta["input_top_logprobs"] = [alternatives(alts) for alts in meta["input_top_logprobs"]]

    def _observe(self, state: _ReqState, new_tokens: int) -> None:
        now = time.time()
        if not state.output_ids and new_tokens:
            self.metrics.observe_first_token(now - state.created_time)
        elif state.last_output_time:
            self.metrics.observe_chunk(now - state.last_output_time, new_tokens)
        state.last_output_time = now

    def _meta(self, state: _ReqState) -> dict[str, Any]:
        meta = {"id": state.rid, **state.meta_info, "weight_version": self.weight_version}  # upstream's key
        if state.stage_timings:
            meta["stage_timings_ms"] = {**meta.get("stage_timings_ms", {}), **rounded(state.stage_timings)}
        fr = state.finished_reason
        meta["finish_reason"] = fr.to_json() if fr is not None else None
        meta["e2e_latency"] = time.time() - state.created_time
        return meta

    def _stream_output(self, state: _ReqState) -> dict[str, Any] | None:
        visible = len(state.text) - (state.holdback.length(state.text) if state.holdback is not None else 0)
        if visible <= state.sent_text_len and len(state.output_ids) <= state.sent_ids_len:
            return None
        state.sent_text_len = max(visible, state.sent_text_len)
        state.sent_ids_len = len(state.output_ids)
        return self._shaped({"text": state.text[: state.sent_text_len], "output_ids": list(state.output_ids),
                             "meta_info": self._meta(state)})

    def _shaped(self, out: dict[str, Any]) -> dict[str, Any]:
        """--skip-tokenizer-init: ids only, no `text` key (upstream's shape: nothing was detokenized)."""
        if self.ids_only:
            del out["text"]
        return out

    def _final_output(self, state: _ReqState) -> dict[str, Any]:
        fr = state.finished_reason
        # An abort with a status is an error (bad input, engine failure); one without is a request
        # ended on purpose (`abort_request`): its output so far, with finish reason "abort".
        if fr.type == "abort" and fr.status_code is not None:
            status = fr.status_code
            raise GenerateError(fr.message or "request aborted", status, "invalid_request_error" if status < 500 else "server_error")
        cut = fr.stop_cut(state.text)
        text = state.text if cut is None else state.text[:cut]
        return self._shaped({"text": text, "output_ids": list(state.output_ids), "meta_info": self._meta(state)})
