"""One spawned rank of the expert-parallel test (gloo, CPU): builds the model at TP=size with --ep-size ep
and returns, for every prompt of `prompts()`, its prompt logits and greedy tokens (as numpy / lists, so a
rank may exit before the test process reads them), with the shapes of its expert weights."""

from __future__ import annotations

import traceback

MAX_NEW = 6


def prompts(path: str) -> dict:
    """Text alone and text around one image, the same on every rank and in the TP=1 reference."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
    from parity_utils import PLACEHOLDER, noise_image, small_processor

    text = lambda n, s: torch.randint(0, 1500, (n,), generator=torch.Generator().manual_seed(s)).tolist()  # noqa: E731
    proc = small_processor(path, 16, (0.5,) * 3, (0.5,) * 3)
    return {"text": (text(19, 1), None),
            "image": proc.process(text(5, 2) + PLACEHOLDER + text(7, 3), [noise_image(96, 64, 4)])}


def logits_and_greedy(runner, path: str) -> dict:
    import torch

    from sglang.srt.model_executor.static_batch import StaticBatchRunner, StaticSeq

    sb = StaticBatchRunner(runner)
    out = {}
    with torch.inference_mode():
        for name, (ids, mm) in prompts(path).items():
            seq = StaticSeq(ids, mm)
            try:
                _, (full,) = sb.extend([seq], return_all_logits=True)
            finally:
                sb.release([seq])
            seq = StaticSeq(ids, mm)
            try:
                tokens = sb.generate_greedy([seq], max_new_tokens=MAX_NEW)[0]
            finally:
                sb.release([seq])
            out[name] = (full.float().cpu().numpy(), tokens)
    return out


def run(rank: int, size: int, ep: int, port: int, path: str, outbox) -> None:
    import torch

    from sglang.srt.distributed.parallel_state import init_tp_group
    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerConfig

    torch.set_num_threads(1)
    try:
        tp = init_tp_group(size, rank, f"127.0.0.1:{port}", "gloo", 120, ep_size=ep)
        runner = ModelRunner(ModelRunnerConfig(model_path=path, dtype="float32", device="cpu", max_total_tokens=2048,
                                               max_running_requests=4, context_length=1024), tp)
        experts = runner.model.model.layers[0].mlp.experts
        info = {"gate_up": tuple(experts.gate_up_proj.shape), "down": tuple(experts.down_proj.shape),
                "first_expert": experts.first_expert}
        outbox.put((rank, "ok", (info, logits_and_greedy(runner, path))))
    except Exception:
        outbox.put((rank, "error", traceback.format_exc()))
        return
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
