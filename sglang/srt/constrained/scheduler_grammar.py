"""The scheduler's grammar queue: a constrained request waits here, holding no KV, while its grammar
compiles in a compile thread (from this rank's own cache: compiled grammars do not cross processes);
the loop never waits on a compile.

Every rank receives the same requests and aborts in the same order, so every rank's queue holds the
same requests. A request leaves it once its compile has ended on every rank (each is bounded by the
compile time limit), all ranks agreeing on its fate by one all-reduce per step while the queue is not
empty: ready when its grammar is ready on every rank, failed when it failed on any (a compile error,
the time limit, a tokenizer that would not load on one rank: any exception), with this rank's own
reason when it failed here too. Deciding on one rank alone would leave the ranks' waiting lists
different and the next collective hung.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.matcher import RequestGrammar
from sglang.srt.constrained.backends import make_grammar_backend
from sglang.srt.constrained.xgrammar_backend import GrammarCompileError, JsonOptions
from sglang.srt.environ import envs

SCHEDULER_CACHE_ENTRIES = 64  # compiled grammars kept per rank (each holds its token-mask cache)
SCHEDULER_COMPILE_PLACES = 2
# a request's state on one rank, reduced with MAX over the ranks: any failure wins over readiness
PENDING, READY, FAILED_400, FAILED_500 = 0, 1, 2, 3
OTHER_RANK_FAILED = "the grammar failed to compile on another tensor-parallel rank"


class GrammarQueue:
    def __init__(self, server_args, tokenizer, vocab_size: int, eos_ids, tp, backend=None,
                 max_entries: int = SCHEDULER_CACHE_ENTRIES):
        # `tokenizer`: the scheduler's own (a callable loading it once per process), or a path
        self.backend = backend or make_grammar_backend(server_args.grammar_backend, tokenizer, vocab_size,
                                                       sorted(eos_ids), JsonOptions.from_server_args(server_args))
        self.cache = GrammarCache(self.backend.compile, max_entries, threads=SCHEDULER_COMPILE_PLACES,
                                  name="sglang-sched-grammar", max_bytes=int(envs.SGLANG_GRAMMAR_CACHE_MB.get() * (1 << 20)),
                                  size_of=lambda compiled: getattr(compiled, "memory_size_bytes", 0),
                                  timeout_s=envs.SGLANG_GRAMMAR_COMPILE_TIMEOUT_S.get(),
                                  prepare=getattr(self.backend, "prepare", None))
        self.tp = tp
        self.pending: list[tuple[object, Future]] = []

    def __len__(self) -> int:
        return len(self.pending)

    def add(self, req, key: tuple[str, str]) -> None:
        self.pending.append((req, self.cache.get(key)))

    def pop_ready(self) -> tuple[list, list[tuple[object, str, int]]]:
        """(requests whose matcher is ready, each with its `grammar` set; (request, error message, HTTP
        status) for grammars that failed on some rank), in arrival order; the rest keep waiting."""
        if not self.pending:
            return [], []
        mine = [_state(fut) for _, fut in self.pending]
        states = mine
        if self.tp.size > 1:
            import torch.distributed as dist

            # per request, in one collective: whether it is still compiling on some rank (MAX), and its
            # state (MAX: a failure on any rank wins over ready)
            t = torch.tensor([[int(s == PENDING), s] for s in mine], dtype=torch.int32)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.tp.cpu_group)
            states = [PENDING if compiling else s for compiling, s in t.tolist()]
        ready, failed, still = [], [], []
        for (req, fut), state, own in zip(self.pending, states, mine):
            if state == PENDING:
                still.append((req, fut))
            elif state == READY:
                try:
                    req.grammar = RequestGrammar(self.backend.matcher(fut.result()), req.sampling_params.grammar_key(),
                                                 start_after=req.grammar_start_after)
                    ready.append(req)
                except Exception as e:  # identical on every rank given the same compiled grammar
                    failed.append((req, f"grammar matcher: {type(e).__name__}: {e}", 500))
            else:
                message = _message(fut) if own >= FAILED_400 else OTHER_RANK_FAILED
                failed.append((req, message, 400 if state == FAILED_400 else 500))
        self.pending = still
        return ready, failed

    def remove(self, rid: str):
        """The waiting request `rid` (taken out), or None."""
        for i, (req, _) in enumerate(self.pending):
            if req.rid == rid:
                del self.pending[i]
                return req
        return None

    def drain(self) -> list:
        reqs = [req for req, _ in self.pending]
        self.pending = []
        return reqs

    def close(self) -> None:
        self.cache.close()


def _state(fut: Future) -> int:
    if not fut.done():
        return PENDING
    if fut.cancelled():
        return FAILED_500
    error = fut.exception()
    if error is None:
        return READY
    return FAILED_400 if isinstance(error, GrammarCompileError) else FAILED_500


def _message(fut: Future) -> str:
    if fut.cancelled():
        return "the grammar compile was cancelled (the scheduler is shutting down)"
    error = fut.exception()
    if isinstance(error, GrammarCompileError):
        return str(error)
    return f"the grammar backend failed: {type(error).__name__}: {error}"
