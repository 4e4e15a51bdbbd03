"""The scheduler's grammar queue: a constrained request waits here, holding no KV, while its grammar
compiles in a compile thread (from this rank's own cache: compiled grammars do not cross processes);
the loop never waits on a compile.

Every rank receives the same requests and aborts in the same order, so every rank's queue holds the
same requests; a request leaves it only once its grammar is ready on every rank (one MIN all-reduce of
the ready flags per step while the queue is not empty), so the ranks' waiting lists stay identical.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.matcher import RequestGrammar
from sglang.srt.constrained.xgrammar_backend import JsonOptions, XGrammarBackend
from sglang.srt.environ import envs

SCHEDULER_CACHE_ENTRIES = 64  # compiled grammars kept per rank (each holds its token-mask cache)
SCHEDULER_COMPILE_PLACES = 2


class GrammarQueue:
    def __init__(self, server_args, tokenizer_path: str, vocab_size: int, eos_ids, tp, backend=None,
                 max_entries: int = SCHEDULER_CACHE_ENTRIES):
        self.backend = backend or XGrammarBackend(tokenizer_path, vocab_size, sorted(eos_ids),
                                                  JsonOptions.from_server_args(server_args))
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

    def pop_ready(self) -> tuple[list, list[tuple[object, str]]]:
        """(requests whose matcher is ready, each with its `grammar` set; (request, error message) for
        grammars that failed to compile), in arrival order; the rest keep waiting."""
        if not self.pending:
            return [], []
        flags = [fut.done() for _, fut in self.pending]
        if self.tp.size > 1:
            import torch.distributed as dist

            t = torch.tensor(flags, dtype=torch.int32)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.tp.cpu_group)
            flags = [bool(f) for f in t.tolist()]
        ready, failed, still = [], [], []
        for (req, fut), done in zip(self.pending, flags):
            if not done:
                still.append((req, fut))
                continue
            error = fut.exception()
            if error is not None:
                failed.append((req, str(error)))
                continue
            req.grammar = RequestGrammar(self.backend.matcher(fut.result()), req.sampling_params.grammar_key(),
                                         start_after=req.grammar_start_after)
            ready.append(req)
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
