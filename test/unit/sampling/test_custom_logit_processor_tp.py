"""Custom logit processors at TP = 2 (two gloo processes): the ranks agree on which requests a processor
ended. A processor that runs past the step limit on rank 0 only, or raises on rank 1 only, ends its request
on both ranks (the other rank's message says so), and one that works on both is applied on both. Deciding
per rank would leave one rank running a request the other had ended, and their batches out of step."""

from __future__ import annotations

from types import SimpleNamespace

from sglang.testing.ranks import run_ranks

_SOURCES = {
    # never returns on rank 0 (its thread is a daemon: it ends with the process)
    "hang_on_0": """
class HangOnRank0(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        import threading
        import torch.distributed as dist
        if dist.get_rank() == 0:
            threading.Event().wait()
        return logits
""",
    "raise_on_1": """
class RaiseOnRank1(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        import torch.distributed as dist
        if dist.get_rank() == 1:
            raise ValueError("only on rank 1")
        return logits
""",
    "force": """
class Force(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        logits[:, :] = -float("inf")
        logits[:, 5] = 0.0
        return logits
""",
}


def _processor(source: str) -> str:
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    ns = {"__name__": "__main__", "CustomLogitProcessor": CustomLogitProcessor}
    exec(source, ns)
    return next(v for k, v in ns.items() if isinstance(v, type) and k != "CustomLogitProcessor").to_str()


def _rank_main(rank: int, port: int, q) -> None:
    import torch
    import torch.distributed as dist

    import sglang.srt.sampling.custom_logit_processor as clp
    from sglang.srt.distributed.parallel_state import init_tp_group
    from sglang.srt.sampling.sampling_params import SamplingParams

    tp = init_tp_group(2, rank, f"127.0.0.1:{port}", "gloo", 60)
    clp.CALL_TIMEOUT_S = 0.5
    texts = {name: _processor(src) for name, src in _SOURCES.items()}
    reqs = [SimpleNamespace(custom_logit_processor=texts[name], sampling_params=SamplingParams(), output_ids=[1])
            for name in ("hang_on_0", "raise_on_1", "force")]
    logits = torch.zeros(3, 8)
    failed = clp.apply_custom_logit_processors(logits, reqs, tp=tp)
    dist.barrier(group=tp.cpu_group)  # a rank whose collectives diverged would not get here with its peer
    q.put((rank, failed, logits.argmax(-1).tolist()))
    dist.destroy_process_group()


def test_the_ranks_agree_on_the_requests_a_processor_ended():
    res = run_ranks(_rank_main, timeout=180)
    for rank in (0, 1):
        failed, argmax = res[rank]
        assert [(row, status) for row, _, status in failed] == [(0, 400), (1, 400)], (rank, failed)
        assert argmax[2] == 5  # the working processor applied on both
    other = "custom_logit_processor failed or ran out of time on another tensor-parallel rank"
    msgs = {rank: {row: msg for row, msg, _ in res[rank][0]} for rank in (0, 1)}
    assert "ran longer than 0.5 s" in msgs[0][0] and msgs[1][0] == other
    assert msgs[0][1] == other and "ValueError: only on rank 1" in msgs[1][1]
