"""DetokenizerManager: token ids from the scheduler -> text deltas for the tokenizer manager.

Runs in its own process: PULL (bound) on `detokenizer_ipc_name` receives `BatchTokenIDOut` and control
replies from scheduler rank 0; PUSH (connected) to `tokenizer_ipc_name` sends `BatchStrOut` and forwards
everything else unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.managers.io_struct import BatchStrOut, BatchTokenIDOut, FinishReason
from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

_REPLACEMENT_CHAR = "\ufffd"


@dataclass
class DecodeState:
    """Incremental decoding state of one request: `sent_text` is what was emitted for `ids[:read_offset]`;
    `ids[prefix_offset:read_offset]` (the last emitted piece) is decoded again as left context, so the
    next delta is the text the new ids add to it."""

    skip_special_tokens: bool
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    sent_text: str = ""


class IncrementalDetokenizer:
    """Per-rid decode states over one tokenizer; no I/O (unit-testable without processes)."""

    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer  # None (--skip-tokenizer-init): ids pass through, every text delta is ""
        self.states: dict[str, DecodeState] = {}

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def step(self, rid: str, new_ids: list[int], skip_special_tokens: bool, finish: FinishReason | None) -> str:
        """Append `new_ids` to `rid` and return the newly complete text; frees the state on finish."""
        st = self.states.get(rid)
        if st is None:
            st = self.states[rid] = DecodeState(skip_special_tokens=skip_special_tokens)
        st.ids.extend(new_ids)
        delta = self._advance(st, final=finish is not None)
        if finish is None:
            st.sent_text += delta
            return delta
        # A stop match is cut off by the tokenizer manager, the one place that holds the whole text.
        del self.states[rid]
        return delta

    def _advance(self, st: DecodeState, final: bool) -> str:
        prefix_text = self._decode(st.ids[st.prefix_offset : st.read_offset], st.skip_special_tokens)
        new_text = self._decode(st.ids[st.prefix_offset :], st.skip_special_tokens)
        # A trailing U+FFFD means the last token ends inside a multi-byte character: wait for the
        # rest, unless the request is over (then the bytes really are invalid).
        if not final and (len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR)):
            return ""
        delta = new_text[len(prefix_text) :]
        st.prefix_offset = st.read_offset
        st.read_offset = len(st.ids)
        return delta

    def handle(self, msg: BatchTokenIDOut) -> BatchStrOut:
        if self.tokenizer is None:
            output_strs = [""] * len(msg.rids)
        else:
            output_strs = [
                self.step(rid, ids, skip, fr)
                for rid, ids, skip, fr in zip(
                    msg.rids, msg.new_token_ids, msg.skip_special_tokens, msg.finished_reasons
                )
            ]
        return BatchStrOut(
            rids=msg.rids,
            output_strs=output_strs,
            new_token_ids=msg.new_token_ids,
            finished_reasons=msg.finished_reasons,
            prompt_tokens=msg.prompt_tokens,
            completion_tokens=msg.completion_tokens,
            cached_tokens=msg.cached_tokens,
            meta_info=msg.meta_info,
        )


class DetokenizerManager:
    def __init__(self, server_args: ServerArgs, port_args: PortArgs, tokenizer: Any | None = None):
        import zmq

        if tokenizer is None and not server_args.skip_tokenizer_init:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(server_args.tokenizer_path or server_args.resolved_model_path())
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.context = zmq.Context(2)
        self.recv_from_scheduler = self.context.socket(zmq.PULL)
        self.recv_from_scheduler.bind(port_args.detokenizer_ipc_name)
        self.send_to_tokenizer = self.context.socket(zmq.PUSH)
        self.send_to_tokenizer.connect(port_args.tokenizer_ipc_name)

    def event_loop(self) -> None:
        while True:
            msg = self.recv_from_scheduler.recv_pyobj()
            if isinstance(msg, BatchTokenIDOut):
                msg = self.detokenizer.handle(msg)
            self.send_to_tokenizer.send_pyobj(msg)

    def close(self) -> None:
        self.context.destroy(linger=0)


def run_detokenizer_process(server_args: ServerArgs, port_args: PortArgs, ready_writer: Any = None) -> None:
    """Process entry. With `ready_writer` (a multiprocessing Connection) reports ("ready", None) once the
    sockets are up, or ("error", message) if start-up fails."""
    try:
        manager = DetokenizerManager(server_args, port_args)
    except Exception as e:
        logger.exception("detokenizer failed to start")
        if ready_writer is not None:
            ready_writer.send(("error", f"detokenizer failed to start: {type(e).__name__}: {e}"))
        raise
    if ready_writer is not None:
        ready_writer.send(("ready", None))
        ready_writer.close()
    try:
        manager.event_loop()
    finally:
        manager.close()
