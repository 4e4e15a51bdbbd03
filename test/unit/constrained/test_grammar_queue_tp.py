"""The scheduler's grammar queue at TP = 2 (two gloo processes): the ranks agree on every request's fate.
A grammar that fails on one rank only (here its tokenizer would not load: an OSError, not a compile
error) fails on both, with the failing rank's reason on that rank and a 500 for a backend failure, and
one that compiles everywhere is ready on both. Deciding per rank had left rank 0 queueing a request
rank 1 had failed, and the ranks' next collectives out of step."""

from __future__ import annotations

from types import SimpleNamespace


from sglang.testing.ranks import run_ranks


class _Backend:
    def __init__(self, rank: int):
        self.rank = rank

    def compile(self, key):
        if key[1] == "only-rank-1-fails" and self.rank == 1:
            raise OSError("tokenizer.json: No such file or directory")
        if key[1] == "invalid":
            from sglang.srt.constrained.xgrammar_backend import GrammarCompileError

            raise GrammarCompileError("invalid regex: bad")
        return f"compiled {key[1]}"

    def matcher(self, compiled):
        return SimpleNamespace(compiled=compiled)


def _req(rid: str, text: str):
    key = ("regex", text)
    return SimpleNamespace(rid=rid, grammar=None, grammar_start_after=None,
                           sampling_params=SimpleNamespace(grammar_key=lambda: key))


def _rank_main(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from sglang.srt.constrained.scheduler_grammar import GrammarQueue
    from sglang.srt.distributed.parallel_state import init_tp_group

    tp = init_tp_group(2, rank, f"127.0.0.1:{port}", "gloo", 60)
    queue = GrammarQueue(None, "unused", 100, [0], tp, backend=_Backend(rank))
    for rid, text in (("a", "only-rank-1-fails"), ("b", "fine"), ("c", "invalid")):
        queue.add(_req(rid, text), ("regex", text))
    ready, failed, steps = [], [], 0
    while queue:  # one collective per step on both ranks: they leave the loop together or hang
        r, f = queue.pop_ready()
        ready += [x.rid for x in r]
        failed += [(x.rid, msg, status) for x, msg, status in f]
        steps += 1
    queue.close()
    dist.barrier(group=tp.cpu_group)  # a rank whose queue diverged would not get here with its peer
    q.put((rank, ready, failed))
    dist.destroy_process_group()


def test_a_grammar_that_fails_on_one_rank_fails_on_every_rank():
    res = run_ranks(_rank_main, timeout=180)
    for rank in (0, 1):
        ready, failed = res[rank]
        assert ready == ["b"], (rank, ready, failed)
        assert sorted((rid, status) for rid, _, status in failed) == [("a", 500), ("c", 400)], (rank, failed)
    msgs = {rank: dict((rid, msg) for rid, msg, _ in res[rank][1]) for rank in (0, 1)}
    assert msgs[0]["a"] == "the grammar failed to compile on another tensor-parallel rank"
    assert msgs[1]["a"] == "the grammar backend failed: OSError: tokenizer.json: No such file or directory"
    assert msgs[0]["c"] == msgs[1]["c"] == "invalid regex: bad"
