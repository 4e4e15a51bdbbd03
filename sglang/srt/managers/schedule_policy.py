"""Which waiting requests join the next prefill batch, and how much of each (chunking)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

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


# Cache-aware orders match every waiting request against the prefix tree; past this many waiting requests
# they fall back to arrival order, as upstream's do (the matching would cost more than it saves).
CACHE_AWARE_MAX_QUEUE = 128


def order_waiting(waiting: list[Req], policy: str, kv, priority_first: bool = False,
                  low_values_first: bool = False, rng: random.Random | None = None) -> list[Req]:
    """The waiting requests in the order the prefill batch takes them (`waiting` is in arrival order).

    fcfs: arrival. lpm: longest cached prefix first. dfs-weight: depth-first over the prefix tree, the
    subtree holding most waiting requests first, so requests sharing a prefix run together. lof: largest
    max_new_tokens first. random: shuffled with `rng` (seeded alike on every TP rank). priority: arrival
    within priority levels. With `priority_first` (--enable-priority-scheduling) every policy orders within
    priority levels: higher `priority` first, lower first with `low_values_first`. Sorts are stable: ties
    keep arrival order. lpm and dfs-weight fall back to arrival order without a prefix cache or past
    CACHE_AWARE_MAX_QUEUE waiting requests."""
    reqs = list(waiting)
    if policy in ("lpm", "dfs-weight") and (kv.tree.disable or len(reqs) > CACHE_AWARE_MAX_QUEUE):
        policy = "fcfs"
    if policy == "lpm":  # shared prefixes run while they are hot
        reqs.sort(key=lambda r: -kv.peek_prefix_len(r))
    elif policy == "dfs-weight":
        reqs = dfs_weight_order(reqs, kv)
    elif policy == "lof":
        reqs.sort(key=lambda r: -r.sampling_params.max_new_tokens)
    elif policy == "random":
        (rng or random).shuffle(reqs)
    if priority_first or policy == "priority":
        sign = 1 if low_values_first else -1
        reqs.sort(key=lambda r: sign * r.priority)
    return reqs


def dfs_weight_order(reqs: list[Req], kv) -> list[Req]:
    """Each request sits at the tree node where its cached prefix ends; a node weighs the number of
    requests in its subtree. A depth-first walk from the root visits the heaviest child first and emits a
    node's own requests (in arrival order) after its subtree's: deeper matches before shallower ones,
    requests matching nothing last."""
    tree = kv.tree
    at: dict[int, list[Req]] = defaultdict(list)
    weight: Counter = Counter()
    for r in reqs:
        node = r.last_node if r.admitted and r.last_node is not None else tree.match_prefix(r.prefix_key()).last_node
        at[node.id].append(r)
        while node is not None:
            weight[node.id] += 1
            node = node.parent
    out: list[Req] = []
    stack = [(tree.root, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            out += at.get(node.id, ())
            continue
        stack.append((node, True))
        children = sorted((c for c in node.children.values() if weight[c.id]), key=lambda c: -weight[c.id])
        stack.extend((c, False) for c in reversed(children))  # the heaviest is popped first
    return out


def preemption_victims(running: list[Req], req: Req, threshold: int, low_values_first: bool = False) -> list[Req]:
    """The running requests `req` may preempt (--enable-priority-scheduling): those whose priority is worse
    than req's by at least `threshold` (and at all), the worst first, then the one with the least output."""
    sign = 1 if low_values_first else -1
    rank = sign * req.priority  # smaller runs first
    victims = [r for r in running if sign * r.priority - rank >= max(threshold, 1)]
    return sorted(victims, key=lambda r: (-sign * r.priority, len(r.output_ids)))


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
        self.blocked_by: str | None = None  # why the last add() failed: "step", "running" or "kv"

    def add(self, req: Req) -> bool:
        """Admits `req` for up to its remaining prefill; False when a budget stops packing."""
        if self.step_tokens <= 0:
            return self._blocked("step")
        if not req.admitted and self.free_running <= 0:
            return self._blocked("running")
        if not req.admitted:
            if self.kv.req_to_token_pool.available_size() == 0 or not self.kv.admit(req):
                return self._blocked("running")
        remaining = len(req.fill_ids) - (1 if req.output_ids else 0) - req.kv_len
        n = min(remaining, self.step_tokens)
        if n < remaining and not self.chunking:
            if self.reqs:
                return self._undo(req, "step")
            n = remaining  # without chunking, an oversized prompt still runs alone
        reserve = decode_reserve(req, self.ratio) if n == remaining else 0
        ps = self.kv.allocator.page_size
        # whole pages: a request's allocation is rounded up to its page size
        budget = (self.kv.available_tokens() - self.reserved - self.pending) // ps * ps - ps * (ps > 1)
        if n + reserve > budget:
            if not self.chunking or budget <= 0:
                return self._undo(req, "kv")
            n, reserve = min(n, budget), 0  # prefill what fits now; the decode reserve comes later
        self.reqs.append(req)
        self.extend_lens.append(n)
        self.step_tokens -= n
        self.pending += -(-n // ps) * ps
        self.reserved += reserve
        self.free_running -= 1
        self.blocked_by = None
        return True

    def release_running(self, req: Req) -> None:
        """`req` left the running batch (preempted, its KV already released): its request slot and its
        decode reserve are free for this batch."""
        self.free_running += 1
        self.reserved -= decode_reserve(req, self.ratio)

    def _blocked(self, why: str) -> bool:
        self.blocked_by = why
        return False

    def _undo(self, req: Req, why: str) -> bool:
        if req.kv_len == req.cache_len:
            self.kv.release(req)  # nothing computed yet: give back the slot and the prefix lock
        return self._blocked(why)
