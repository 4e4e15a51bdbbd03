"""The scheduler's output side: applying a batch's sampled tokens, stop conditions, finishing and
failing requests, and sending token ids (with meta info) to the detokenizer."""

from __future__ import annotations

import logging
import time
from collections import deque
from itertools import compress, repeat
from operator import and_, attrgetter, ge, is_not, or_, sub

from sglang.srt.managers.io_struct import BatchTokenIDOut, FinishReason
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch, all_none
from sglang.srt.metrics.stage_timer import STAGES, rounded
from sglang.srt.sampling.stop_regex import StopRegexError, search_output
from sglang.srt.sampling.stop_strings import StopStrings

logger = logging.getLogger(__name__)
_OUTPUT_IDS, _SENT_LEN = attrgetter("output_ids"), attrgetter("sent_len")
_TO_ABORT, _FINISHED_REASON = attrgetter("to_abort"), attrgetter("finished_reason")


class SchedulerOutputProcessorMixin:
    report_dp_rank = False  # --dp-size > 1: meta_info names the replica (the Scheduler sets it)
    _stop_strings: StopStrings | None = None  # made on first use: the stop-string check's caches

    # ------------------------------------------------------------------ results
    def run_batch(self, batch: ScheduleBatch) -> None:
        start = time.perf_counter()
        result = self.worker.forward_batch_generation(batch, self.stage_timer.enabled)
        self.process_batch_result(batch, result, start)

    def process_batch_result(self, batch: ScheduleBatch, result, start: float) -> None:
        """Applies a step's sampled tokens (`start`: when the step was launched)."""
        timer = self.stage_timer
        next_ids, totals, logprobs, input_logprobs = result
        logprobs = logprobs or [None] * len(next_ids)
        for (i, pos), (lp, alts) in zip(batch.input_logprob_owners, input_logprobs):
            req = batch.reqs[i]
            k = pos - req.input_logprob_start
            req.input_token_logprobs[k] = (lp, req.origin_input_ids[pos])
            req.input_top_logprobs[k] = alts[: req.sampling_params.top_logprobs_num]
        now = time.perf_counter()
        if timer.enabled:
            step_ms = (now - start) * 1e3
            if batch.mode.is_extend():
                step_ms -= totals.get("vit_encode", 0.0) + totals.get("embed_merge", 0.0)
            for r in batch.reqs:
                timer.add(r.stage_timings_ms, "llm_prefill" if batch.mode.is_extend() else "decode", step_ms)
        if batch.mode.is_extend():
            if self.chunked_req is not None and any(r is self.chunked_req for r in batch.reqs):
                self.chunked_req = None
            for req, tok, lp in zip(batch.reqs, next_ids, logprobs):
                if req.is_prefilling():
                    self.chunked_req = req
                    continue
                if req.to_abort is not None:  # ended by this step (e.g. an image that could not be decoded)
                    self.finish(req, req.to_abort)
                    continue
                if req.output_ids:  # re-prefill after retraction: its next token is already known
                    self.running.append(req)
                    continue
                if req.sampling_params.max_new_tokens == 0:  # scoring: the prompt's logprobs, no output token
                    self.finish(req, FinishReason("length"))
                    continue
                timer.add(req.stage_timings_ms, "first_token", (time.time() - req.created_time) * 1e3)
                self._append_token(req, tok, lp)
                if not req.finished():
                    self.running.append(req)
        else:
            self._apply_decode_tokens(batch.reqs, next_ids, logprobs)
            if not all_none(map(_FINISHED_REASON, self.running)):  # a scan in C; a list only when one ended
                self.running = [r for r in self.running if not r.finished()]
        if self._profiler is not None:
            self._profiler.after_forward()  # with num_steps, the last one writes the trace

    def _apply_decode_tokens(self, reqs: list[Req], next_ids: list[int], logprobs: list) -> None:
        """A decode step's tokens, as `_append_token` per row would apply them (a request that ended while
        the step was queued, overlapped, gets none). A row is *plain* when its token is only appended (and
        its request streamed when due): no grammar, stop strings, stop regex, logprob or pending abort, its
        token none of its stop ids, its length short of its limit. Runs of plain rows are applied with
        C-level maps, the other rows by `_append_token`, all in row order, so the outbox (and with it the
        order of outputs) is the same; a plain row's append touches no other request's state."""
        n = len(reqs)
        if not n:
            return
        rules = self._finish_rules(reqs)
        outputs = list(map(_OUTPUT_IDS, reqs))
        stop_ids, last_free_len, special, stream = zip(*rules)
        slow = list(map(or_, map(or_, special, map(frozenset.__contains__, stop_ids, next_ids)),
                        map(ge, map(len, outputs), last_free_len)))
        # rarer, checked per row only when present: an abort pending, a request that ended while the step was
        # queued (overlap), a logprob to record
        if not (all_none(map(_TO_ABORT, reqs)) and all_none(map(_FINISHED_REASON, reqs)) and all_none(logprobs)):
            slow = list(map(any, zip(slow, map(is_not, map(_TO_ABORT, reqs), repeat(None)),
                                     map(is_not, map(_FINISHED_REASON, reqs), repeat(None)),
                                     map(is_not, logprobs, repeat(None)))))
        streams = any(stream)
        start = 0
        for i in compress(range(n), slow):  # usually none; at most the rows that finish or need checks
            self._append_plain(reqs, outputs, next_ids, stream, start, i, streams)
            if reqs[i].finished_reason is None:
                self._append_token(reqs[i], next_ids[i], logprobs[i])
            start = i + 1
        self._append_plain(reqs, outputs, next_ids, stream, start, n, streams)

    def _append_plain(self, reqs, outputs, next_ids, stream, a: int, b: int, streams: bool) -> None:
        """Rows [a, b) are plain: each token appended to its request's output; streaming requests whose
        unsent tokens reach --stream-interval join the outbox, in row order."""
        if a >= b:
            return
        deque(map(list.append, outputs[a:b], next_ids[a:b]), maxlen=0)
        if streams:
            unsent = map(sub, map(len, outputs[a:b]), map(_SENT_LEN, reqs[a:b]))
            due = map(and_, stream[a:b], map(ge, unsent, repeat(self.server_args.stream_interval)))
            self.outbox.extend(compress(reqs[a:b], due))

    def _finish_rules(self, reqs: list[Req]) -> list[tuple]:
        """Per request, what `_check_finished` needs to tell a plain row, computed at its first decode step and
        kept on the request (its sampling params, grammar and stream flag are fixed once it is scheduled):
        (stop ids: EOS unless ignore_eos, and stop_token_ids; the last output length that cannot end it by
        length: min(max_new_tokens, context - prompt) - 1; whether every token needs the full check
        (grammar, stop strings, stop regex); whether it streams)."""
        rules = list(map(getattr, reqs, repeat("_finish_rule"), repeat(None)))
        if None in rules:
            eos = frozenset(self.eos_ids)
            for i, r in enumerate(reqs):
                if rules[i] is None:
                    sp = r.sampling_params
                    stops = frozenset(sp.stop_token_ids) | (frozenset() if sp.ignore_eos else eos)
                    limit = min(sp.max_new_tokens, self.context_length - r.prompt_len)
                    special = r.grammar is not None or bool(sp.stop) or bool(sp.stop_regex)
                    rules[i] = r._finish_rule = (stops, limit - 1, special, bool(r.stream))
        return rules

    def _append_token(self, req: Req, tok: int, logprob=None) -> None:
        if req.to_abort is not None:  # ended during this step (its custom logit processor failed): no token
            self.finish(req, req.to_abort)
            return
        req.output_ids.append(tok)
        if logprob is not None:
            req.output_token_logprobs.append((logprob[0], tok))
            req.output_top_logprobs.append(logprob[1])
        if req.grammar is not None and not req.grammar.accept(tok):  # only when the row allowed no token
            self.running = [r for r in self.running if r is not req]
            self._grammar_dead_end(req, tok)
            return
        try:
            reason = self._check_finished(req, tok)
        except Exception as e:  # e.g. a tokenizer failure while matching stop strings
            logger.exception("request %s failed while checking its stop conditions", req.rid)
            self.running = [r for r in self.running if r is not req]
            self._fail(req, e)
            return
        if reason is not None:
            self.finish(req, reason)
        elif req.stream and len(req.output_ids) - req.sent_len >= self.server_args.stream_interval:
            self.outbox.append(req)

    def _check_finished(self, req: Req, tok: int) -> FinishReason | None:
        sp = req.sampling_params
        if tok in self.eos_ids and not sp.ignore_eos:
            return FinishReason("stop", matched=tok)
        if tok in sp.stop_token_ids:
            return FinishReason("stop", matched=tok)
        if req.grammar is not None and req.grammar.is_terminated():  # the grammar is complete (its stop token)
            return FinishReason("stop", matched=tok)
        if sp.stop:  # decodes the output's tail only at steps where a stop string can appear in it
            if self._stop_strings is None:
                self._stop_strings = StopStrings()
            s = self._stop_strings.check(self.tokenizer, req.output_ids, sp.stop)
            if s is not None:
                return FinishReason("stop", matched=s, stop_text=None if sp.no_stop_trim else s)
        if sp.stop_regex:
            try:  # decoded as the detokenizer does, so that the cut lands on the same characters there
                m = search_output(sp.stop_regex, req.output_ids,
                                  lambda ids: self.tokenizer.decode(ids, skip_special_tokens=sp.skip_special_tokens))
            except StopRegexError as e:
                return FinishReason("abort", message=str(e), status_code=400)
            if m is not None:
                trim = not sp.no_stop_trim
                return FinishReason("stop", matched=m.pattern, stop_text=m.text if trim else None,
                                    stop_chars_after=m.chars_after if trim else None)
        if len(req.output_ids) >= sp.max_new_tokens:
            return FinishReason("length")
        if req.prompt_len + len(req.output_ids) >= self.context_length:
            return FinishReason("length")
        return None

    def _grammar_dead_end(self, req: Req, tok: int) -> None:
        """The sampled token does not fit the grammar. The bitmask allowed only fitting tokens, so the row
        allowed none: the grammar's language ended here without being complete (every rank sees the same
        row, so all end it alike). That is the request's grammar, not the server: 400 naming it."""
        kind = req.grammar.key[0] if req.grammar.key else "grammar"
        if req.grammar.allows_no_token(self.worker.vocab_size):
            self.finish(req, FinishReason("abort", status_code=400, message=(
                f"invalid {kind}: no output can continue it after {len(req.output_ids) - 1} token(s) (a schema that "
                "only refers to itself, such as {\"$ref\": \"#\"}, matches nothing)")))
        else:
            self._fail(req, ValueError(f"sampled token {tok} does not fit the request's {kind}"))

    def _fail(self, req: Req, error: BaseException) -> None:
        """Ends one request with a server error; its KV is released and the others go on."""
        self.num_request_errors += 1
        if req.finished():
            return
        msg = f"internal error while processing this request: {type(error).__name__}: {error}"
        self.finish(req, FinishReason("abort", message=msg, status_code=500))

    def _fail_batch(self, batch: ScheduleBatch, error: BaseException) -> None:
        """A forward failed: nobody can tell which request caused it, so every request of the batch
        ends with the error; requests not in the batch are untouched."""
        in_batch = {id(r) for r in batch.reqs}
        self.running = [r for r in self.running if id(r) not in in_batch]
        if self.chunked_req is not None and id(self.chunked_req) in in_batch:
            self.chunked_req = None
        for req in batch.reqs:
            req.kv_cacheable = False  # the step's KV (and recurrent state) may be half written: never cached
            self._fail(req, error)

    def finish(self, req: Req, reason: FinishReason) -> None:
        req.finished_reason = reason
        # stages measured upstream (tokenizer process) were logged there
        self.stage_timer.emit(req.rid, req.stage_timings_ms, [st for st in STAGES if st not in req.upstream_stages])
        self.release_kv(req)
        self.outbox.append(req)

    def flush_outputs(self) -> None:
        if not self.outbox or self.tp.rank != 0:
            self._release_finished(self.outbox)
            self.outbox.clear()
            return
        seen, reqs = set(), []
        for r in self.outbox:
            if id(r) not in seen:
                seen.add(id(r))
                reqs.append(r)
        self.outbox.clear()
        out = BatchTokenIDOut([], [], [], [], [], [], [], [])
        for r in reqs:
            out.rids.append(r.rid)
            out.new_token_ids.append(r.output_ids[r.sent_len :])
            meta = self._meta_info(r)
            if r.output_token_logprobs:  # only the new positions: the tokenizer side accumulates them
                meta["output_token_logprobs_delta"] = r.output_token_logprobs[r.sent_len :]
                meta["output_top_logprobs_delta"] = r.output_top_logprobs[r.sent_len :]
            if r.input_logprob_start is not None and not r.input_logprobs_sent and (r.output_ids or r.finished()):
                meta["input_token_logprobs"] = r.input_token_logprobs
                if r.sampling_params.top_logprobs_num:
                    meta["input_top_logprobs"] = r.input_top_logprobs
                r.input_logprobs_sent = True
            r.sent_len = len(r.output_ids)
            out.finished_reasons.append(r.finished_reason)
            out.prompt_tokens.append(r.prompt_len)
            out.completion_tokens.append(len(r.output_ids))
            out.cached_tokens.append(r.cached_tokens)
            out.skip_special_tokens.append(r.sampling_params.skip_special_tokens)
            out.meta_info.append(meta)
        self._release_finished(reqs)
        self.send(out)

    def _release_finished(self, reqs: list[Req]) -> None:
        """After their last output is built: finished requests' embedder state goes (every rank)."""
        for r in reqs:
            if r.finished():
                self.release_worker_state(r)

    def _meta_info(self, req: Req) -> dict:
        meta = {"prompt_tokens": req.prompt_len, "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_tokens, "tp_broadcast_ms": round(req.tp_broadcast_ms, 3)}
        if req.mm_inputs is not None:
            meta["vit_encoded_images"] = self.worker.mm_encoded_images(req.rid)
        if req.stage_timings_ms:
            meta["stage_timings_ms"] = rounded(req.stage_timings_ms)
        if self.report_dp_rank:
            meta["dp_rank"] = self.dp_rank
        return meta

    def send(self, obj) -> None:
        if self.send_socket is not None:
            self.send_socket.send_pyobj(obj)
