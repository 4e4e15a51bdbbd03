"""A request's grammar state while it decodes, and the token bitmask applied to a batch's logits.

Each constrained request (each of n copies, on every TP rank) owns a `RequestGrammar`: an xgrammar
matcher that has accepted exactly the request's output tokens so far. Each step the worker fills one
bitmask row per constrained request and applies them to the logits in one op before sampling; a batch
without constrained requests pays nothing. Every rank drives its matchers from the same sampled tokens,
so their bitmasks are identical.

With reasoning (`start_after`: the token ending it, `</think>`), the grammar applies only to the tokens
after that token's first occurrence in the output: until then the row is not masked and the matcher
stays at the grammar's start.

Retraction and preemption keep a request's output tokens (its re-prefill only rebuilds KV), so its
matcher stays valid; `sync` still checks the count and last token before each fill (O(1) per step, never
a rescan of the output) and takes new tokens, rolls back, or replays from the grammar's start whenever
output and matcher disagree.
"""

from __future__ import annotations

import torch


class RequestGrammar:
    """Invariant: the matcher's state is the one after the first `consumed` output tokens, the last of
    which was `last` (the tokens before and including the start token are consumed without reaching the
    matcher). `sync` relies on it to cost O(1) on an unchanged output and O(new tokens) on a longer one:
    no step rescans the output, which over a long reasoning would be quadratic."""

    def __init__(self, matcher, key: tuple[str, str] | None = None, start_after: int | None = None):
        self.matcher = matcher
        self.key = key
        self.accepted: list[int] = []  # the output tokens the matcher has accepted, in order
        self.start_after = start_after
        self.waiting = start_after is not None  # the start token has not been output yet
        self.consumed = 0  # output tokens taken so far (reasoning and start token included)
        self.last: int | None = None  # output token number `consumed` - 1

    def accept(self, token: int) -> bool:
        """Advance by a sampled token; False (state unchanged) when the grammar does not allow it."""
        token = int(token)
        if self.waiting:  # reasoning: any token, the matcher starts after the end of reasoning
            self.waiting = token != self.start_after
        elif self.matcher.accept_token(token):
            self.accepted.append(token)
        else:
            return False
        self.consumed += 1
        self.last = token
        return True

    def is_terminated(self) -> bool:
        return not self.waiting and self.matcher.is_terminated()

    def is_active(self) -> bool:
        """The next token is masked: the grammar has started and is not complete."""
        return not self.waiting and not self.matcher.is_terminated()

    def _token_at(self, i: int) -> int:
        """The consumed output token at position i < consumed, from what the grammar kept: the start token
        or a token it accepted (positions inside the reasoning are not kept: -1)."""
        begin = self.consumed - len(self.accepted)  # first position after the start token
        if i >= begin:
            return self.accepted[i - begin]
        return self.start_after if not self.waiting and i == begin - 1 else -1

    def sync(self, output_ids) -> None:
        """Bring the matcher to the state after `output_ids` (after the start token, with `start_after`).
        The output grows or shrinks only at its end (a retraction keeps it), so one token identifies the
        prefix: nothing when the matcher is there already; the new tokens when the output grew; a
        rollback when it shrank past the start token; otherwise a replay from the grammar's start."""
        m, n = len(output_ids), self.consumed
        if n == m and (m == 0 or output_ids[m - 1] == self.last):
            return
        if n < m and (n == 0 or output_ids[n - 1] == self.last):
            self._consume(output_ids[n:])
            return
        begin = n - len(self.accepted)
        if not self.waiting and 0 < m < n and begin <= m and output_ids[m - 1] == self._token_at(m - 1):
            self.matcher.rollback(n - m)
            del self.accepted[m - begin:]
            self.consumed, self.last = m, int(output_ids[m - 1])
            return
        self.matcher.reset()
        self.accepted = []
        self.waiting = self.start_after is not None
        self.consumed, self.last = 0, None
        self._consume(output_ids)

    def _consume(self, tokens) -> None:
        for tok in tokens:
            if not self.accept(tok):
                raise ValueError(f"output token {tok} at position {len(self.accepted)} does not fit the grammar")

    def allows_no_token(self, vocab_size: int) -> bool:
        """The grammar is open and no token can continue it (its language ran out here: e.g. a tool's
        parameters schema {"$ref": "#"} after the call's opening text)."""
        if not self.is_active():
            return False
        bitmask = allocate_bitmask(1, vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask, 0)
        return not bool(bitmask.any())

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)


def allocate_bitmask(batch: int, vocab_size: int) -> torch.Tensor:
    """The token bitmask both backends fill: int32 words, bit j of word w allowing token 32 * w + j, every
    token allowed until a row is filled (xgrammar's and llguidance's layout)."""
    return torch.full((batch, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def _is_xgrammar(matcher) -> bool:
    return type(matcher).__module__.split(".")[0] == "xgrammar"


def grammar_rows(grammars: list[RequestGrammar | None]) -> list[int]:
    """Rows whose request decodes under a grammar that has started and is still open."""
    return [i for i, g in enumerate(grammars) if g is not None and g.is_active()]


def apply_grammar_bitmask(logits: torch.Tensor, grammars: list[RequestGrammar | None], outputs: list[list[int]],
                          vocab_size: int) -> list[int]:
    """Masks, in place, every token the row's grammar does not allow next (-inf), for the constrained rows
    of `logits` (B, >= vocab_size); unconstrained rows are untouched. Returns the constrained rows."""
    rows = grammar_rows(grammars)
    if not rows:
        return rows
    for i in rows:
        grammars[i].sync(outputs[i])
    synced = set(rows)
    rows = grammar_rows([g if i in synced else None for i, g in enumerate(grammars)])  # sync may un-start one
    if not rows:
        return rows
    bitmask = allocate_bitmask(len(grammars), vocab_size)
    pooled = [i for i in rows if _is_xgrammar(grammars[i].matcher)] if len(rows) > 1 else []
    if pooled:  # xgrammar's rows filled in parallel by its thread pool
        _batch_filler().batch_fill_next_token_bitmask([grammars[i].matcher for i in pooled], bitmask, pooled)
    for i in rows if not pooled else sorted(set(rows) - set(pooled)):
        grammars[i].fill(bitmask, i)
    width = logits.shape[-1]
    if logits.device.type == "cpu":
        apply_bitmask_sparse_cpu(logits, bitmask, rows, min(width, vocab_size))
    elif logits.is_cuda and _bitmask_kernel() is not None:
        apply_bitmask_cuda(logits, bitmask, rows, min(width, vocab_size))
    else:  # another device, or CUDA without triton / sgl_kernel
        apply_bitmask_torch(logits, bitmask[rows], rows, min(width, vocab_size))
    if width > vocab_size:  # padded logits: the padding is never a token
        logits[rows, vocab_size:] = float("-inf")
    return rows


_BATCH_FILLER = None


def _batch_filler():
    global _BATCH_FILLER
    if _BATCH_FILLER is None:
        import xgrammar as xg

        _BATCH_FILLER = xg.BatchGrammarMatcher()
    return _BATCH_FILLER


_KERNEL = None  # sgl_kernel's Triton bitmask op, or False when triton or sgl_kernel does not import


def _bitmask_kernel():
    global _KERNEL
    if _KERNEL is None:
        try:
            import triton  # noqa: F401
            from sgl_kernel.sampling import apply_token_bitmask, padded_words

            _KERNEL = (apply_token_bitmask, padded_words)
        except ImportError:
            _KERNEL = False
    return _KERNEL or None


def apply_bitmask_cuda(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], width: int) -> None:
    """The bitmask's listed rows applied to CUDA logits by sgl_kernel's Triton kernel: one pass reading the
    packed words (copied to the device in rows padded to `padded_words`, so that the kernel loads 4 words
    at once) and storing -inf at the banned tokens; no (rows, vocab) temporary."""
    apply, padded_words = _bitmask_kernel()
    words = (width + 31) // 32
    host = torch.nn.functional.pad(bitmask[rows, :words], (0, padded_words(width) - words))  # one gather
    apply(logits, host.to(logits.device), torch.tensor(rows, dtype=torch.int32).to(logits.device), width)


def apply_bitmask_torch(logits: torch.Tensor, bits: torch.Tensor, rows: list[int], width: int) -> None:
    """The bitmask (one int32 row per entry of `rows`, bit j of word i allowing token 32 i + j) applied on
    the logits' device with torch ops (an unpack to (rows, vocab) booleans and a masked fill): the path of
    logits on a device other than the CPU when sgl_kernel's Triton kernel is not available."""
    bits = bits.to(logits.device, non_blocking=True)
    shifts = torch.arange(32, device=logits.device, dtype=torch.int32)
    allowed = ((bits.unsqueeze(-1) >> shifts) & 1).view(len(rows), -1)[:, :width].bool()
    idx = torch.tensor(rows, device=logits.device)
    logits[idx, :width] = logits[idx, :width].masked_fill(~allowed, float("-inf"))


_BITS = torch.arange(32, dtype=torch.int32)
_ALL_ALLOWED = -1  # an int32 word with every bit set


def apply_bitmask_sparse_cpu(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int], width: int) -> None:
    """The bitmask applied to CPU logits touching only what changes: equal to xgrammar's CPU op (-inf on
    every token < `width` whose bit is clear), without unpacking whole rows.

    A row's words are all-allowed (-1), all-banned (0) or mixed; only mixed words are unpacked. A
    permissive row (most words allowed: inside a JSON string) gets -inf written to its few banned tokens;
    a restrictive row (most words banned: between JSON tokens) keeps its few allowed logits, is filled
    with -inf at memset speed, and gets them back. Either way the scattered writes are the minority set."""
    words = (width + 31) // 32
    idx = torch.tensor(rows, dtype=torch.long)
    bm = bitmask[idx, :words]
    zero, full = bm == 0, bm == _ALL_ALLOWED
    restrictive = zero.sum(1) * 2 > words  # (R,)
    mixed_r, mixed_c = (~(zero | full)).nonzero(as_tuple=True)
    bits = ((bm[mixed_r, mixed_c].unsqueeze(1) >> _BITS) & 1).bool()  # (M, 32): True allowed
    mixed_tok = mixed_c.unsqueeze(1) * 32 + _BITS
    in_vocab = mixed_tok < width
    mixed_restrictive = restrictive[mixed_r].unsqueeze(1)

    def word_tokens(word_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r, c = word_mask.nonzero(as_tuple=True)
        tok = (c.unsqueeze(1) * 32 + _BITS).reshape(-1)
        row = r.repeat_interleave(32)
        keep = tok < width
        return row[keep], tok[keep]

    # permissive rows: -inf on the banned tokens (all-banned words, clear bits of mixed words)
    pr, pt = word_tokens(zero & ~restrictive.unsqueeze(1))
    banned = ~bits & in_vocab & ~mixed_restrictive
    pr = torch.cat([pr, mixed_r.unsqueeze(1).expand_as(banned)[banned]])
    pt = torch.cat([pt, mixed_tok[banned]])
    if pr.numel():
        logits[idx[pr], pt] = float("-inf")
    # restrictive rows: keep the allowed tokens' logits, fill the row, put them back
    if bool(restrictive.any()):
        rr, rt = word_tokens(full & restrictive.unsqueeze(1))
        allowed = bits & in_vocab & mixed_restrictive
        rr = torch.cat([rr, mixed_r.unsqueeze(1).expand_as(allowed)[allowed]])
        rt = torch.cat([rt, mixed_tok[allowed]])
        kept = logits[idx[rr], rt]
        logits[idx[restrictive], :width] = float("-inf")
        logits[idx[rr], rt] = kept


def revive_dead_rows(adjusted: torch.Tensor, grammar_masked: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Rows that other masks (min_new_tokens bans on EOS) left with no allowed token while their grammar
    allows only those tokens: the grammar wins (its allowed tokens, unbanned). Call only when a ban and a
    grammar share a row: this reads a flag back from the device."""
    idx = torch.tensor(rows, device=adjusted.device)
    dead = torch.isneginf(adjusted[idx]).all(dim=-1)
    if not bool(dead.any()):
        return adjusted
    adjusted = adjusted.clone()
    for i in idx[dead].tolist():
        adjusted[i] = grammar_masked[i]
    return adjusted
