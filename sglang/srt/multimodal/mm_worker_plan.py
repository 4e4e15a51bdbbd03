"""`--mm-processor-worker-num` and `--mm-io-worker-num` resolved for one server, and its worker pool started.

Workers are used only where their results can travel: the shared-memory transport on one host
(`transport.shm.use_shm_transport`) and not `--language-only`. Asked for elsewhere, start-up refuses them
(`server_args_checks`); unset, the default resolves to none there. The default count comes from the
measurements in docs/optimizations/mm-frontend.md (`default_worker_num`).
"""

from __future__ import annotations

import logging
import os

from sglang.srt.environ import envs
from sglang.srt.multimodal.transport.shm import segment_prefix

logger = logging.getLogger(__name__)

DEFAULT_IO_THREADS = 4  # fetch and decode threads per worker (--mm-io-worker-num)


def default_worker_num(cpus: int) -> int:
    """Workers when --mm-processor-worker-num is unset: one per two CPUs, at least one and at most four
    (docs/optimizations/mm-frontend.md: on 2 CPUs one worker takes the tokenizer manager's CPU per image from
    ~57 ms to ~3 ms, and a second adds little throughput where two cores are all there is)."""
    return max(1, min(4, cpus // 2))


def worker_plan(server_args) -> tuple[int, str]:
    """(preprocessing workers, why that many)."""
    asked = server_args.mm_processor_worker_num
    if asked is not None:
        return asked, f"--mm-processor-worker-num {asked}"
    if server_args.language_only:
        return 0, "default: none with --language-only (the encoders take the images)"
    if server_args.mm_feature_transport != "cpu" or not envs.SGLANG_MM_SHM_TRANSPORT.get() or server_args.nnodes > 1:
        return 0, "default: none without the shared-memory transport"
    cpus = os.cpu_count() or 1
    return default_worker_num(cpus), f"default for {cpus} CPU(s)"


def start_worker_pool(server_args, model_path: str):
    """The server's `MMProcessorPool`, spawned (not yet waited for: `wait_ready`), or None when it has no
    workers (0 asked or resolved, or a model without a multimodal processor). Logs the choice."""
    from sglang.srt.multimodal.hashing import configured_hash_algo, precompute_hash_enabled
    from sglang.srt.multimodal.mm_worker_pool import MMProcessorPool
    from sglang.srt.multimodal.processor_spec import ProcessorSpec
    from sglang.srt.multimodal.processors.base import is_multimodal_model

    n, why = worker_plan(server_args)
    spec = ProcessorSpec.from_server_args(server_args, model_path)
    cfg = spec.hf_config()
    if n and not is_multimodal_model(cfg.get("architectures"), cfg.get("model_type")):
        n, why = 0, f"{why}, but model {model_path} takes no images"
    if n == 0:
        logger.info("image preprocessing in the tokenizer manager's threads (%s)", why)
        return None
    io_threads = server_args.mm_io_worker_num or DEFAULT_IO_THREADS
    logger.info("image preprocessing in %d worker process(es) sglang-mmproc0..%d, %d fetch/decode thread(s) each (%s)",
                n, n - 1, io_threads, why)
    hash_algo = configured_hash_algo() if precompute_hash_enabled() else None
    return MMProcessorPool(spec, n, io_threads, segment_prefix(server_args.port), hash_algo,
                           server_args.log_level).start()


__all__ = ["DEFAULT_IO_THREADS", "default_worker_num", "start_worker_pool", "worker_plan"]
