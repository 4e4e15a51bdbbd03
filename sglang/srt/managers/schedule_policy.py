"""Which waiting requests join the next prefill batch, and how much of each (chunking)."""

from __future__ import annotations

from sglang.srt.managers.schedule_batch import Req

# Tokens held back per request for its coming decode steps when admitting prefills, at most this
# many per request; a decode step that still runs short retracts a request instead of failing.
DECODE_RESERVE_CLIP = 256
# Most requests stop well before max_new_tokens, so admission reserves only a fraction of what is
# left (the new-token ratio): it starts at INIT, decays toward MIN while decoding goes well and jumps
# back after a retraction. Both scale with --schedule-conservativeness.
NEW_TOKEN_RATIO_INIT = 0.7
NEW_TOKEN_RATIO_MIN = 0.1
NEW_TOKEN_RATIO_DECAY_STEPS = 600


class NewTokenRatio:
    def __init__(self, conservativeness: float = 1.0):
        self.init = min(1.0, NEW_TOKEN_RATIO_INIT * conservativeness)
        self.min = min(self.init, NEW_TOKEN_RATIO_MIN * conservativeness)
        self.decay = (self.init - self.min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.value = self.init

    def on_decode_step(self) -> None:
        self.value = max(self.min, self.value - self.decay)

    def on_retract(self, running: list[Req]) -> None:
        """Admission was too optimistic: reserve at least what the survivors still need on average,
        and never less than the initial ratio."""
        left = sum(r.remaining_new_tokens() for r in running)
        asked = sum(r.sampling_params.max_new_tokens for r in running) or 1
        self.value = min(1.0, max(self.init, left / asked + 0.05))


def decode_reserve(req: Req, ratio: float = 1.0) -> int:
    return min(-(-int(req.remaining_new_tokens() * ratio * 1000) // 1000), DECODE_RESERVE_CLIP)


def pick_retract_victim(running: list[Req]) -> Req:
    """The request whose retraction loses least and frees most: the fewest output tokens so far (its
    recompute is cheapest), then the longest prompt."""
    return min(running, key=lambda r: (len(r.output_ids), -r.prompt_len))


def order_waiting(waiting: list[Req], policy: str, kv) -> list[Req]:
    if policy == "lpm":  # longest cached prefix first: shared prefixes run while they are hot
        return sorted(waiting, key=lambda r: -kv.peek_prefix_len(r))
    return list(waiting)


class PrefillAdder:
    """Greedy packing under three budgets: tokens this step, KV slots, running-request slots."""

    def __init__(self, kv, running: list[Req], step_tokens: int, max_running: int, chunking: bool,
                 new_token_ratio: float = 1.0):
        self.kv = kv
        self.step_tokens = step_tokens
        self.chunking = chunking
        self.ratio = new_token_ratio
        self.free_running = max_running - len(running)
        self.reserved = sum(decode_reserve(r, self.ratio) for r in running)  # decode of admitted requests
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
        reserve = decode_reserve(req, self.ratio) if n == remaining else 0
        ps = self.kv.allocator.page_size
        # whole pages: a request's allocation is rounded up to its page size
        budget = (self.kv.available_tokens() - self.reserved - self.pending) // ps * ps - ps * (ps > 1)
        if n + reserve > budget:
            if not self.chunking or budget <= 0:
                return self._undo(req)
            n, reserve = min(n, budget), 0  # prefill what fits now; the decode reserve comes later
        self.reqs.append(req)
        self.extend_lens.append(n)
        self.step_tokens -= n
        self.pending += -(-n // ps) * ps
        self.reserved += reserve
        self.free_running -= 1
        return True

    def _undo(self, req: Req) -> bool:
        if req.kv_len == req.cache_len:
            self.kv.release(req)  # nothing computed yet: give back the slot and the prefix lock
        return False
