"""The scheduler's grammar queue: a constrained request waits here, holding no KV, while its grammar
compiles in a compile thread (from this rank's own cache: compiled grammars do not cross processes);
the loop never waits on a compile.

This is the only place a grammar compiles: the tokenizer manager checks only what is cheap (the size
limit, the JSON parse, `grammar_limits`), so each new grammar compiles once per rank and nowhere else.
A compile here is therefore also the grammar's validation (`compile_checked`): an invalid grammar, one
whose language is empty, or one past the compile time limit ends its request with a 400 naming the
problem, sent by TP rank 0 only (the other ranks' outputs are not sent), so the client hears it once;
the other requests and the loop go on.

Every rank receives the same requests and aborts in the same order, so every rank's queue holds the
same requests. A request leaves it once its compile has ended on every rank (each is bounded by the
compile time limit), all ranks agreeing on its fate by one all-reduce per step while the queue is not
empty: ready when its grammar is ready on every rank, failed when it failed on any (a compile error,
the time limit, a tokenizer that would not load on one rank: any exception), with this rank's own
reason when it failed here too. Deciding on one rank alone would leave the ranks' waiting lists
different and the next collective hung.
"""

from __future__ import annotations

import json
from concurrent.futures import Future

import torch

from sglang.srt.constrained.backends import make_grammar_backend
from sglang.srt.constrained.grammar_cache import GrammarCache
from sglang.srt.constrained.matcher import RequestGrammar
from sglang.srt.constrained.xgrammar_backend import GrammarCompileError, JsonOptions
from sglang.srt.environ import envs

SCHEDULER_CACHE_ENTRIES = 64  # compiled grammars kept per rank (each holds its token-mask cache)
# compiles at a time per rank: the only compile site, so as many as the tokenizer side's check had (two
# grammars past the time limit leave places for a small one: it does not wait for their limit)
SCHEDULER_COMPILE_PLACES = 4
# a request's state on one rank, reduced with MAX over the ranks: any failure wins over readiness
PENDING, READY, FAILED_400, FAILED_500 = 0, 1, 2, 3
OTHER_RANK_FAILED = "the grammar failed to compile on another tensor-parallel rank"
EMPTY_LANGUAGE = "admits no output at all (a schema that only refers to itself, such as {\"$ref\": \"#\"}, matches nothing)"


def compile_checked(backend, key: tuple[str, str]):
    """`backend.compile(key)`, refused (GrammarCompileError) when no output can match it: an empty
    language would sample from an all-masked row, so it is a 400 here, not a failure mid-decode. A
    structural tag's JSON schemas are checked one by one too (the tag's own start admits its begin text
    even when a schema inside it admits nothing). Runs in the compile thread, within the time limit."""
    kind, text = key
    nodes = _json_nodes(_loads_or_none(text)) if kind == "structural_tag" else []  # parsed once
    # checked before the library sees it, so the message is ours whatever the library's version says
    # (xgrammar 0.2.8 compiled {"$ref": "#"} to an empty language, 0.2.9 refuses it in its own words)
    if kind == "json_schema" and ref_only_cycle(_loads_or_none(text)):
        raise GrammarCompileError(f"invalid {kind}: it {EMPTY_LANGUAGE}")
    for where, schema in nodes:
        if ref_only_cycle(schema):
            raise GrammarCompileError(f"invalid {kind}: the JSON schema at {where} {EMPTY_LANGUAGE}")
    compiled = backend.compile(key)  # raises GrammarCompileError naming the problem
    if not hasattr(backend, "admits_no_output"):
        return compiled
    if backend.admits_no_output(compiled):
        raise GrammarCompileError(f"invalid {kind}: it {EMPTY_LANGUAGE}")
    for where, schema in nodes:
        if backend.admits_no_output(backend.compile(("json_schema", json.dumps(schema)))):
                raise GrammarCompileError(f"invalid {kind}: the JSON schema at {where} {EMPTY_LANGUAGE}")
    return compiled


_ANNOTATIONS = {"$defs", "definitions", "$schema", "$id", "$comment", "title", "description", "examples", "default"}


def _loads_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None  # the backend reports the parse error in its place


def _pointer(root, ref: str):
    """The node a local `$ref` ("#", "#/$defs/a") names, or None (remote or broken: the backend's to judge)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        return None
    node = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def ref_only_cycle(schema) -> bool:
    """True when the schema is nothing but a chain of `$ref`s that comes back to itself (`{"$ref": "#"}`,
    `a -> b -> a`): no value can match it. Only the root's chain is followed: a cycle through content (an
    object whose property refers back) is an ordinary recursive schema."""
    node, seen = schema, set()
    while isinstance(node, dict) and "$ref" in node and set(node) - _ANNOTATIONS == {"$ref"}:
        if id(node) in seen:
            return True
        seen.add(id(node))
        node = _pointer(schema, node["$ref"])
    return False


def backend_name(backend) -> str:
    """The grammar library a backend object runs, from the object itself."""
    return getattr(backend, "name", None) or type(backend).__name__.removesuffix("Backend").lower()


def _json_nodes(tag) -> list[tuple[str, object]]:
    """(path, schema) of every json_schema node of a structural tag (tool calls' parameters included)."""
    found, stack = [], [(tag, "$")]
    while stack:  # iterative: a 64 KiB text can nest thousands of levels
        node, path = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "json_schema" and "json_schema" in node:
                found.append((path, node["json_schema"]))
            stack.extend((v, f"{path}.{k}") for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return found


class GrammarQueue:
    def __init__(self, server_args, tokenizer, vocab_size: int, eos_ids, tp, backend=None,
                 max_entries: int = SCHEDULER_CACHE_ENTRIES):
        # `tokenizer`: the scheduler's own (a callable loading it once per process), or a path
        self.backend = backend or make_grammar_backend(server_args.grammar_backend, tokenizer, vocab_size,
                                                       sorted(eos_ids), JsonOptions.from_server_args(server_args))
        # the backend is read at compile time (tests swap it)
        self.cache = GrammarCache(self._compile, max_entries, threads=SCHEDULER_COMPILE_PLACES,
                                  name="sglang-sched-grammar", max_bytes=int(envs.SGLANG_GRAMMAR_CACHE_MB.get() * (1 << 20)),
                                  size_of=lambda compiled: getattr(compiled, "memory_size_bytes", 0),
                                  timeout_s=envs.SGLANG_GRAMMAR_COMPILE_TIMEOUT_S.get(),
                                  prepare=getattr(self.backend, "prepare", None))
        self.tp = tp
        self.pending: list[tuple[object, Future]] = []
        self.compiles: dict[str, int] = {}  # backend -> grammars compiled (attempts, failures included)

    def __len__(self) -> int:
        return len(self.pending)

    def _compile(self, key: tuple[str, str]):
        """compile_checked, counted under the backend that really compiled it (observable: a server asked
        for llguidance that compiles with xgrammar shows it in /get_server_info)."""
        name = backend_name(self.backend)
        self.compiles[name] = self.compiles.get(name, 0) + 1
        return compile_checked(self.backend, key)

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
