"""Owns the model on one TP rank plus its KV memory pools and attention backend."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang.srt.configs.attention_defaults import default_attention_backends
from sglang.srt.configs.vit_strategy import ViTStrategy
from sglang.srt.distributed.parallel_state import SINGLE_RANK, TPInfo
from sglang.srt.environ import envs
from sglang.srt.layers.attention.base_attn_backend import create_attention_backend
from sglang.srt.layers.attention.vision_attention import configure_vision_attention
from sglang.srt.layers.linear import kv_heads_per_rank
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.layers.quantization.kv_cache import checkpoint_kv_scales, is_scale_tensor, param_file_kv_scales
from sglang.srt.mem_cache.kv_cache_dtype import resolve_kv_cache_dtype
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.state_pool import GDNStatePool
from sglang.srt.model_executor.memory_budget import kv_budget_tokens
from sglang.srt.server_args import derive_max_running_requests
from sglang.srt.multimodal.embedder import MultimodalEmbedConfig, MultimodalEmbedder
from sglang.srt.model_loader.loader import get_model
from sglang.srt.model_loader.weight_utils import iterate_weights

logger = logging.getLogger(__name__)
STATE_POOL = "the recurrent-state pool"


@dataclass(frozen=True)
class ModelRunnerConfig:
    model_path: str
    dtype: str = "auto"
    device: str = "cpu"
    max_total_tokens: int | None = 16384  # None: derive from mem_fraction_static (GPU) or 65536 (CPU)
    mem_fraction_static: float = 0.85
    max_running_requests: int | None = 64  # request-table rows; None: derived from this rank's KV budget
    context_length: int | None = None
    attention_backend: str = "auto"  # auto: triton on CUDA, torch_native elsewhere (configs/attention_defaults.py)
    mm_attention_backend: str = "auto"  # auto: triton on CUDA, sdpa elsewhere
    attention_fp32_precision: str = "tf32"  # Triton attention on CUDA float32: tf32 or ieee
    # device bytes other processes take on this rank's GPU after the KV budget is fixed (the cuda_ipc
    # feature pool and the contexts that map it), by what takes them: subtracted from the KV budget
    reserved_device_bytes: tuple[tuple[str, int], ...] = ()
    cuda_graph: bool = False  # capture decode graphs (CUDA and a backend that supports them)
    cuda_graph_max_bs: int | None = None  # default: min(160, request-table rows)
    cuda_graph_bs: tuple[int, ...] | None = None
    page_size: int = 1
    max_mamba_cache_size: int | None = None  # hybrid models: state snapshot slots (None: as many as request rows)
    enable_vit_ulysses_sp: bool = False  # --enable-vit-ulysses-sp: replicated vision tower, tokens split over TP
    mm_enable_dp_encoder: bool = False  # --mm-enable-dp-encoder: replicated vision tower, images split over TP
    language_only: bool = False  # --language-only (EPD): no vision tower; images arrive as encoders' embeddings
    quantization: str | None = None  # --quantization (a checkpoint's own quantization_config applies regardless)
    kv_cache_dtype: str = "auto"  # --kv-cache-dtype: auto (the model dtype), fp8_e4m3, fp8_e5m2
    quantization_param_path: str | None = None  # --quantization-param-path: FP8 KV cache scales (JSON)
    load_format: str = "auto"  # --load-format: auto / safetensors, or dummy (weights from config.json alone)
    seed: int | None = None  # dummy weights' seed (None: the loader's default)


class ModelRunner:
    def __init__(self, cfg: ModelRunnerConfig, tp: TPInfo = SINGLE_RANK):
        self.cfg = cfg
        self.tp = tp
        self.device = torch.device(cfg.device)
        # vision-tower switches resolved once here, with the server flag beside the environment's
        vit = ViTStrategy.from_env(ulysses_sp=cfg.enable_vit_ulysses_sp, dp_encoder=cfg.mm_enable_dp_encoder,
                                   towers="text" if cfg.language_only else "all")
        self.model = get_model(cfg.model_path, cfg.dtype, self.device, tp, vit, cfg.quantization, cfg.load_format,
                               cfg.seed)
        self.model_config = self.model.config
        self.dtype = next(self.model.parameters()).dtype
        text = self.model_config.text
        self.context_length = cfg.context_length or text.max_position_embeddings
        num_kv_heads = kv_heads_per_rank(text.num_key_value_heads, tp.size)
        self.kv_dtype = resolve_kv_cache_dtype(cfg.kv_cache_dtype, self.dtype)
        # a hybrid model's linear-attention layers keep a per-request state instead of KV
        self.kv_layers = kv_layer_ids(text)
        self.state_shape = self.model.gdn_state_shape() if hasattr(self.model, "gdn_state_shape") else None
        # the model's linear-attention layers take the Gated DeltaNet kernels here: they address states in the
        # pool by row, so no per-request state view is built for them, and their decode can be captured
        self.gdn_kernels = self.state_shape is not None and hybrid_graph_refusal(self.model, self.device) is None
        # decode graphs over the state pool point padding requests at one extra row (state_pool.py): reserved
        # whenever they are asked for and the model's GDN path can be captured (CPU tests run it uncaptured)
        self.state_padding_row = self.gdn_kernels and cfg.cuda_graph
        bytes_per_token = 2 * len(self.kv_layers) * num_kv_heads * text.head_dim * self.kv_dtype.itemsize
        self.max_total_num_tokens = self._kv_budget(bytes_per_token)
        kv_scales = self._kv_scales(tp, text.num_hidden_layers) if self.kv_dtype != self.dtype else None
        if kv_scales is not None and len(self.kv_layers) != text.num_hidden_layers:
            # scales are named by decoder layer; the pool's layer axis counts only the KV layers
            kv_scales = {j: kv_scales[i] for j, i in enumerate(self.kv_layers) if i in kv_scales}
        if self.kv_dtype != self.dtype:
            logger.info("KV cache in %s (%d bytes per token on this rank, %.1fx the tokens of %s): %d tokens%s",
                        str(self.kv_dtype).removeprefix("torch."), bytes_per_token,
                        self.dtype.itemsize / self.kv_dtype.itemsize, str(self.dtype).removeprefix("torch."),
                        self.max_total_num_tokens, f", scales for {len(kv_scales)} layers" if kv_scales else
                        ", scales 1.0")
        self.max_total_num_tokens -= self.max_total_num_tokens % cfg.page_size
        rows = cfg.max_running_requests
        if rows is None:  # a rank's own budget is >= the one the ranks agree on: enough rows for it
            rows = derive_max_running_requests(self.max_total_num_tokens, self.context_length) + 1
        self.req_to_token_pool = ReqToTokenPool(rows, self.context_length, self.device)
        self.token_to_kv_pool = MHATokenToKVPool(
            self.max_total_num_tokens + cfg.page_size - 1, num_kv_heads, text.head_dim, len(self.kv_layers),
            self.kv_dtype, self.device, kv_scales,
        )
        self.state_pool = None
        if self.state_shape is not None:
            snapshots = rows if cfg.max_mamba_cache_size is None else cfg.max_mamba_cache_size
            self.state_pool = GDNStatePool(self.state_shape, rows, self.device, snapshots,
                                           padding_row=self.state_padding_row)
            logger.info("hybrid model: KV cache for %d of %d layers, %d bytes per token, %d tokens (%.1f MiB); "
                        "recurrent state for %d layers, %d bytes per request, %d rows + %d prefix-cache snapshots "
                        "(%.1f MiB)", len(self.kv_layers), text.num_hidden_layers, bytes_per_token,
                        self.max_total_num_tokens, self.max_total_num_tokens * bytes_per_token / 2**20,
                        self.state_shape.num_layers, self.state_shape.bytes_per_request(), rows, snapshots,
                        self.state_pool.total_bytes() / 2**20)
        self.allocator = TokenToKVPoolAllocator(self.max_total_num_tokens, "cpu", cfg.page_size)  # host bookkeeping: slots reach the device with the step metadata
        lm_auto, mm_auto = default_attention_backends(self.device.type)
        self.attention_backend = lm_auto if cfg.attention_backend == "auto" else cfg.attention_backend
        self.mm_attention_backend = mm_auto if cfg.mm_attention_backend == "auto" else cfg.mm_attention_backend
        self.attn_backend = create_attention_backend(self.attention_backend, fp32_precision=cfg.attention_fp32_precision)
        configure_vision_attention(self.model, self.mm_attention_backend, cfg.attention_fp32_precision)
        # switches resolved once here: the embedding strategy and its cache are fixed for the process
        self.mm_embedder = MultimodalEmbedder(MultimodalEmbedConfig.from_env())
        self.cuda_graph_runner = self._init_cuda_graphs()
        self.vit_graph_runner = self._init_vit_graph()

    def _init_cuda_graphs(self):
        cfg = self.cfg
        if not cfg.cuda_graph or self.device.type != "cuda":
            return None
        why = hybrid_graph_refusal(self.model, self.device)
        if why is not None:
            logger.info("%s; running decode eagerly", why)
            return None
        if not getattr(self.attn_backend, "supports_cuda_graph", False):
            logger.info("decode CUDA graphs need --attention-backend triton; running decode eagerly")
            return None
        from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner, capture_batch_sizes

        max_bs = cfg.cuda_graph_max_bs or min(160, self.req_to_token_pool.size - 1)
        try:
            return CudaGraphRunner(self, capture_batch_sizes(max_bs, cfg.cuda_graph_bs))
        except Exception:  # a failed capture costs speed, never the server
            logger.exception("decode CUDA graph capture failed; running decode eagerly")
            return None

    def _init_vit_graph(self):
        """SGLANG_VIT_ENABLE_CUDA_GRAPH: the vision tower through token-budget graphs (captured on CUDA,
        padded but eager elsewhere); a tower or backend that cannot take them keeps running eagerly."""
        if not envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get():
            return None
        tower = getattr(self.model, "visual", None)
        why = None
        if not hasattr(tower, "forward_embedded"):
            why = f"{type(tower).__name__} has no graph-ready forward (Qwen3-VL towers only)"
        elif getattr(tower, "sp", None) is not None:
            why = "--enable-vit-ulysses-sp splits the tower's tokens over ranks"
        elif self.device.type == "cuda" and self.mm_attention_backend != "triton":
            why = "the captured tower needs --mm-attention-backend triton (segments change under replay)"
        if why:
            logger.warning("SGLANG_VIT_ENABLE_CUDA_GRAPH is set but unused: %s", why)
            return None
        from sglang.srt.model_executor.vit_cuda_graph_runner import ViTCudaGraphRunner, token_buckets

        buckets = token_buckets(envs.SGLANG_VIT_CUDA_GRAPH_BUCKETS.get() or None, tower.merge**2)
        runner = ViTCudaGraphRunner(tower, buckets, capture=self.device.type == "cuda")
        self.model.vit_graph = runner
        return runner

    def shrink_kv_budget(self, num_tokens: int) -> None:
        """TP ranks must agree on one KV budget (scheduling decisions are replicated): use the
        smallest; a larger pool on this rank simply stays partly unused."""
        if num_tokens < self.max_total_num_tokens:
            self.max_total_num_tokens = num_tokens
            self.allocator = TokenToKVPoolAllocator(num_tokens, "cpu", self.cfg.page_size)

    def _kv_scales(self, tp: TPInfo, num_layers: int) -> dict[int, list[float]]:
        """This rank's FP8 KV scales; a file or tensor that cannot be used raises KVScaleError (one line)."""
        if self.cfg.quantization_param_path:
            return param_file_kv_scales(self.cfg.quantization_param_path, tp.rank, num_layers)
        if self.cfg.load_format == "dummy":  # no checkpoint to read scales from: 1.0
            return {}
        return checkpoint_kv_scales(((n, t) for n, t in iterate_weights(self.cfg.model_path, lazy=True)
                                     if is_scale_tensor(n)), num_layers)

    def _kv_budget(self, bytes_per_token: int) -> int:
        if self.cfg.max_total_tokens is not None:
            return self.cfg.max_total_tokens
        if self.device.type != "cuda":
            return 65536
        free, total = torch.cuda.mem_get_info(self.device)
        reserved = dict(self.cfg.reserved_device_bytes)
        if self.state_shape is not None:  # the state pool's rows come out of the same budget, first
            rows = self.cfg.max_running_requests or derive_max_running_requests(
                int(total * self.cfg.mem_fraction_static) // bytes_per_token, self.context_length) + 1
            snapshots = rows if self.cfg.max_mamba_cache_size is None else self.cfg.max_mamba_cache_size
            slots = rows + snapshots + int(self.state_padding_row)
            reserved[STATE_POOL] = slots * self.state_shape.bytes_per_request()
        tokens, budget = kv_budget_tokens(total, free, self.cfg.mem_fraction_static, sum(reserved.values()),
                                          bytes_per_token)
        if reserved:
            logger.info("KV budget on %s leaves %s for later allocations", self.device,
                        ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in reserved.items()))
        if budget < bytes_per_token * 1024:
            raise RuntimeError(
                f"--mem-fraction-static {self.cfg.mem_fraction_static} leaves {budget / 2**30:.2f} GiB for the KV "
                "cache after loading weights" + (f" and reserving {sum(reserved.values()) / 2**30:.2f} GiB for "
                + " and ".join(_reserved_names(reserved)) if reserved else "")
                + ": raise it or use a smaller model"
            )
        return tokens

    @torch.inference_mode()
    def forward(self, forward_batch):
        forward_batch.req_to_token_pool = self.req_to_token_pool
        forward_batch.token_to_kv_pool = self.token_to_kv_pool
        forward_batch.attn_backend = self.attn_backend
        forward_batch.mm_embedder = self.mm_embedder
        self.req_to_token_pool.apply_pending()
        graphed = self.cuda_graph_runner is not None and self.cuda_graph_runner.can_run(forward_batch)
        if self.state_pool is not None:
            self._bind_states(forward_batch, graphed)
        if graphed:
            return self.cuda_graph_runner.replay(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)

    def _bind_states(self, forward_batch, graphed: bool) -> None:
        """The state pool's side of a forward, all before the model runs (and outside any graph): the queued
        copies, then fresh rows zeroed and the batch's states handed over (eager), or nothing more (a
        replayed graph reads its own slot buffer, cuda_graph_runner.py)."""
        pool, extend = self.state_pool, forward_batch.forward_mode.is_extend()
        if forward_batch.gdn_captures and not extend:  # the decode kernels (and graphs) carry no capture
            raise RuntimeError("state snapshot captures in a decode batch: captures come only with EXTEND batches")
        if graphed:
            pool.apply_pending()
            return
        forward_batch.gdn_states = pool.states_for(forward_batch.req_pool_indices_cpu,
                                                   forward_batch.extend_prefix_lens_cpu if extend else None,
                                                   views=not self.gdn_kernels)
        if forward_batch.gdn_captures and not self.gdn_kernels:  # the kernels copy captures by slot
            forward_batch.gdn_capture_states = [[(at, pool.state(slot)) for at, slot in caps]
                                                for caps in forward_batch.gdn_captures]


def hybrid_graph_refusal(model, device: torch.device) -> str | None:
    """Why decode CUDA graphs cannot cover this model's recurrent-state layers on `device`, or None (no such
    layers, or they take the Gated DeltaNet kernels, whose decode reads only device slots). The per-request
    torch path (SGLANG_GDN_BACKEND=torch, or auto without the kernels) loops over host lists: refused."""
    if not hasattr(model, "gdn_state_shape"):
        return None
    uses = getattr(model, "gdn_uses_kernels", None)
    if uses is not None and uses(device):
        return None
    return ("decode CUDA graphs cover recurrent-state layers only on the Gated DeltaNet kernels "
            "(SGLANG_GDN_BACKEND=triton, or auto with triton and sgl_kernel on CUDA); this model takes the "
            "per-request torch path")


def kv_layer_ids(text) -> tuple[int, ...]:
    """Decoder layers that write KV, in KV-pool layer order: all of them, or a hybrid model's
    full-attention layers (whose attention then takes its index in this tuple as its KV layer id)."""
    hybrid = getattr(text, "hybrid", None)
    return hybrid.full_attention_layers if hybrid is not None else tuple(range(text.num_hidden_layers))


def _reserved_names(reserved: dict[str, int]) -> list[str]:
    names = [STATE_POOL] if STATE_POOL in reserved else []
    if any(k != STATE_POOL for k in reserved):
        names.append("the cuda_ipc feature pool (SGLANG_MM_FEATURE_CACHE_MB) and its contexts")
    return names
