"""Which waiting requests join the next prefill batch, and how much of each (chunking)."""

from __future__ import annotations

from sglang.srt.managers.schedule_batch import Req

# Tokens held back per request for its coming decode steps when admitting prefills; a decode step
# that still runs short retracts a request instead of failing.
DECODE_RESERVE_CLIP = 256


def decode_reserve(req: Req) -> int:
    return min(req.remaining_new_tokens(), DECODE_RESERVE_CLIP)


def order_waiting(waiting: list[Req], policy: str, kv) -> list[Req]:
    if policy == "lpm":  # longest cached prefix first: shared prefixes run while they are hot
        return sorted(waiting, key=lambda r: -kv.peek_prefix_len(r))
    return list(waiting)


class PrefillAdder:
    """Greedy packing under three budgets: tokens this step, KV slots, running-request slots."""

    def __init__(self, kv, running: list[Req], step_tokens: int, max_running: int, chunking: bool):
        self.kv = kv
        self.step_tokens = step_tokens
        self.chunking = chunking
        self.free_running = max_running - len(running)
        self.reserved = sum(decode_reserve(r) for r in running)  # decode steps of admitted requests
        self.pending = 0  # slots this batch will allocate
        self.reqs: list[Req] = []
        self.extend_lens: list[int] = []

    def add(self, req: Req) -> bool:
        """Admits `req` for up to its remaining prefill; False when a budget stops packing."""
        if self.step_tokens <= 0 or (not req.admitted and self.free_running <= 0):
            return False
        if not req.admitted:
            if self.kv.req_to_token_pool.available_size() == 0 or not self.kv.admit(req):
                return False
        remaining = len(req.fill_ids) - (1 if req.output_ids else 0) - req.kv_len
        n = min(remaining, self.step_tokens)
        if n < remaining and not self.chunking:
            if self.reqs:
                return self._undo(req)
            n = remaining  # without chunking, an oversized prompt still runs alone
        reserve = decode_reserve(req) if n == remaining else 0
        budget = self.kv.available_tokens() - self.reserved - self.pending
        if n + reserve > budget:
            if not self.chunking or budget <= 0:
                return self._undo(req)
            n, reserve = min(n, budget), 0  # prefill what fits now; the decode reserve comes later
        self.reqs.append(req)
        self.extend_lens.append(n)
        self.step_tokens -= n
        self.pending += n
        self.reserved += reserve
        self.free_running -= 1
        return True

    def _undo(self, req: Req) -> bool:
        if req.kv_len == req.cache_len:
            self.kv.release(req)  # nothing computed yet: give back the slot and the prefix lock
        return False
