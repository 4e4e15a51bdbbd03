"""The one place that reads `os.environ`: a typed registry of every SGLANG_* switch.

Each switch is declared once with its type, default and meaning; code reads `envs.NAME.get()`.
`python -m sglang.srt.environ` lists them with their current values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


def _parse_bool(raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "y", "on"):
        return True
    if v in ("0", "false", "no", "n", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0/true/false/yes/no/y/n/on/off), got {raw!r}")


# upstream's boolean spellings, for switches that are 0/1 plus more choices
_BOOL_ALIASES = {**{k: "1" for k in ("true", "yes", "y", "on")}, **{k: "0" for k in ("false", "no", "n", "off")}}


# SGLANG_RESIZE_RESAMPLE: the PIL.Image filter names upstream accepts
RESAMPLE_NAMES = ("NEAREST", "BOX", "BILINEAR", "HAMMING", "BICUBIC", "LANCZOS")


def _parse_resample(raw: str) -> str:
    name = raw.strip().upper()
    if name and name not in RESAMPLE_NAMES:
        raise ValueError(f"expected one of {', '.join(RESAMPLE_NAMES)} (PIL's resampling filters), got {raw!r}")
    return name


def _parse_pixels(raw: str) -> int | None:
    if not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"expected a positive integer number of pixels, got {raw!r}")
    return value


def _parse_positive_int(raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"expected a positive integer, got {raw!r}")
    return value


def _parse_choice(raw: str, choices: tuple[str, ...], aliases: dict[str, str] | None = None) -> str:
    v = raw.strip().lower()
    v = (aliases or {}).get(v, v)
    if v not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
    return v


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    default: T
    parse: Callable[[str], T]
    doc: str

    def get(self) -> T:
        raw = os.environ.get(self.name)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"invalid value for {self.name}: {e}") from None

    def is_set(self) -> bool:
        return self.name in os.environ


class _Registry:
    def __init__(self):
        self._vars: dict[str, EnvVar[Any]] = {}

    def add(self, name: str, default: T, parse: Callable[[str], T], doc: str) -> EnvVar[T]:
        if name in self._vars:
            raise ValueError(f"{name} declared twice")
        var = EnvVar(name, default, parse, doc)
        self._vars[name] = var
        setattr(self, name, var)
        return var

    def all(self) -> list[EnvVar[Any]]:
        return list(self._vars.values())


envs = _Registry()
envs.add("SGLANG_MODEL_CACHE", "", str, "Directory for generated embedded models (default ~/.cache/sglang/models).")
envs.add("SGLANG_VLM_CACHE_SIZE_MB", 100.0, float, "Byte budget (MiB) of the vision-encoder embedding cache.")
envs.add("SGLANG_ENCODER_TIMEOUT_S", 60.0, float,
         "--language-only (EPD): longest one encoder call may take (then its items go to another encoder), and "
         "longest scheduler rank 0 holds a zmq_to_scheduler request for its embeddings (then 503).")
envs.add("SGLANG_EPD_EMBEDDING_PORT", 0, int,
         "--language-only (EPD): the TCP port encoders push embeddings to on this host (0: a free port picked at "
         "start-up; fix it where a firewall or NetworkPolicy lists the ports encoders may reach).")
envs.add("SGLANG_EPD_MAX_EMBEDDING_MB", 4096, int,
         "--language-only (EPD): largest embedding message (one request's share from one encoder) a language server "
         "accepts, in MiB; larger ones are dropped unread.")
envs.add("SGLANG_MM_SHM_TRANSPORT", True, _parse_bool,
         "With --mm-feature-transport cpu and every rank on one host, pixel data crosses processes in POSIX shared "
         "memory and requests carry metadata only (0: baseline, pixels pickled inside the request and the TP broadcast).")
envs.add("SGLANG_MM_FEATURE_CACHE_MB", 4096, int,
         "Size (MiB) of the device pool that --mm-feature-transport cuda_ipc copies pixel data into, allocated once "
         "on the tokenizer process's GPU; an item that finds no room within a short wait goes through shared memory.")
envs.add("SGLANG_USE_IPC_POOL_HANDLE_CACHE", True, _parse_bool,
         "With --mm-feature-transport cuda_ipc, each scheduler process opens the feature pool's CUDA IPC handle once "
         "and keeps it (0: baseline, every item opens and closes the handle).")
envs.add("SGLANG_MM_IPC_DEBUG", False, _parse_bool,
         "With --mm-feature-transport cuda_ipc, receivers check each slice's generation against the pool's release "
         "board before and after reading it, and fail loudly on a freed or reused slice.")
envs.add("SGLANG_OVERLAP_SCHEDULE_ON_CPU", False, _parse_bool,
         "Run the overlap scheduler on a CPU device too (without --disable-overlap-schedule it is on for CUDA; on CPU "
         "the forward thread's compute competes with the scheduler thread for the same cores, -12% tok/s measured on "
         "2 cores, so by default a CPU server runs step by step).")
envs.add("SGLANG_MM_UINT8_PIXELS", False, _parse_bool,
         "Images and video frames cross processes as uint8 after resize, with the recipe to normalize them; the "
         "rescale, normalize and patchify run in float32 where the vision tower runs, bit-identical to the "
         "processor's (0: baseline, float32 pixel_values made in the tokenizer process).")
envs.add("SGLANG_MM_COMPACT_STILL_IMAGES", False, _parse_bool,
         "A still image travels and is embedded as one temporal frame instead of the duplicated pair: patch rows "
         "of C*P*P values, and the vision tower's patch embedding folds its kernel over the temporal axis (exact "
         "in exact arithmetic); half the pixel bytes and patch-embed FLOPs per image. Videos are unchanged "
         "(0: baseline, every still image repeated over temporal_patch_size frames).")
envs.add("SGLANG_VIT_CHUNK_PER_IMAGE", True, _parse_bool,
         "Chunked prefill encodes only the images overlapping each chunk, cached per image hash (0: baseline, "
         "the first chunk touching any image encodes all of the request's images, cached under their combined hash).")
envs.add("SGLANG_VLM_STAGE_TIMER", False, _parse_bool,
         "Time every VLM pipeline stage per request (same as --enable-vlm-stage-timer).")
envs.add("SGLANG_TEST_DEVICE", "cpu", str, "Device the test suite runs models on (cpu or cuda).")
envs.add("SGLANG_TORCH_PROFILER_DIR", "/tmp", str,
         "Directory the schedulers' torch.profiler traces go under (upstream's variable and default), fixed at "
         "launch: /start_profile writes there, or to its output_dir taken inside it; one outside it is a 400.")
envs.add("SGLANG_PROFILE_NUM_STEPS", 64, int,
         "Forward steps /start_profile records when its request names no num_steps, then it stops and writes the "
         "trace by itself (upstream: until /stop_profile; the trace grows with every step, ~0.2 MiB a step on CPU).")
envs.add("SGLANG_PROFILE_MAX_STEPS", 256, int,
         "Largest num_steps /start_profile accepts (a larger one is a 400): bounds the trace's memory and the time "
         "the scheduler stops to write it.")
# grammars (constrained output): what one request's grammar may cost the others
envs.add("SGLANG_GRAMMAR_MAX_BYTES", 65536, int,
         "Largest grammar text accepted (a regex, EBNF, JSON schema or structural tag, in UTF-8 bytes); a larger one "
         "is a 400 naming the limit, before anything compiles it.")
envs.add("SGLANG_GRAMMAR_COMPILE_TIMEOUT_S", 30.0, float,
         "Longest a grammar may compile (seconds, from the start of its compile); past it the request is a 400 "
         "naming the limit and the compile, which cannot be interrupted, no longer holds a compile thread.")
envs.add("SGLANG_GRAMMAR_CACHE_MB", 128.0, float,
         "Byte budget (MiB) of each scheduler rank's compiled-grammar cache (xgrammar's own size of each compiled "
         "grammar); least recently used grammars go first, one larger than the budget is not kept.")
envs.add("SGLANG_VIT_PATCH_EMBED_LINEAR", True, _parse_bool,
         "ViT patch embedding as one Linear, Conv3d checkpoint weights reshaped at load (0: baseline Conv3d).")
envs.add("SGLANG_VIT_FAST_POS_EMBED", True, _parse_bool,
         "ViT position-embedding interpolation and 2D rotary indices cached per grid shape, gathered on device "
         "(0: baseline, recomputed per forward).")
envs.add("SGLANG_VIT_ENABLE_CUDA_GRAPH", False, _parse_bool,
         "Capture the Qwen3-VL vision tower as CUDA graphs per token-budget bucket and replay them (CUDA with "
         "--mm-attention-backend triton; without CUDA the padded path runs eagerly, for tests).")
envs.add("SGLANG_VIT_CUDA_GRAPH_BUCKETS", "", str,
         "Comma-separated patch budgets of the ViT CUDA graphs (empty: 512 to 16384 in steps of at most 1.5x); larger "
         "batches run eagerly.")
envs.add("SGLANG_MM_PRECOMPUTE_HASH", "1", lambda raw: _parse_choice(raw, ("0", "1", "auto"), _BOOL_ALIASES),
         "Image content hashes and pad values computed in the tokenizer process, in worker threads, before sending "
         "(0: baseline, the scheduler hashes every image in its loop; auto: same as 1, measured to never lose).")
envs.add("SGLANG_MM_HASH_ALGO", "xxh3_128", lambda raw: _parse_choice(raw, ("xxh3_128", "blake3", "sha256")),
         "Image content hash: xxh3_128, blake3 (both over dtype, shape, grid and bytes) or sha256 (the baseline, bytes "
         "only). Unset: xxh3_128, or sha256 when SGLANG_MM_PRECOMPUTE_HASH=0.")
envs.add("SGLANG_MM_SINGLE_FLIGHT", True, _parse_bool,
         "Each distinct image in flight (the same URL, or the same bytes in any encoding) is fetched, decoded, "
         "preprocessed and hashed once, by the first request carrying it; identical images of one request once "
         "(0: every image processed on its own, no identity read or digest taken in the tokenizer process).")
envs.add("SGLANG_MM_DATA_URL_TEXT_KEY", True, _parse_bool,
         "With preprocessing workers, a data-URL image's single-flight identity is a digest of its base64 text and "
         "the worker decodes it: the tokenizer process skips the base64 decode (~11% of its CPU per 1280x720 JPEG "
         "chat); the same picture sent as a data URL and as raw bytes is then two images (0: decoded in the "
         "tokenizer process and keyed by its bytes, every encoding of one picture shared).")

envs.add("SGLANG_IMAGE_MAX_PIXELS", None, _parse_pixels,
         "Upstream's cap on the pixels of one resized image: lowers the model's max_pixels (never raises it); "
         "unset: the model's preprocessor config (upstream's default, 12845056, is not applied).")
envs.add("SGLANG_MAX_PROMPT_CHARS_PER_TOKEN", 32, int,
         "A prompt's text (after the chat template; /tokenize's too) longer than the context length times this many "
         "characters is a 400 before it is tokenized; a token id list to decode, longer than the context length.")
envs.add("SGLANG_VIDEO_MAX_SECONDS", 3600.0, float,
         "Longest video accepted (seconds, from the file's header); a longer one is a 400 naming the limit.")
envs.add("SGLANG_VIDEO_MAX_BYTES", 4 << 30, _parse_positive_int,
         "Largest video after decoding (bytes): the float32 pixel values of its sampled frames at the size the "
         "model takes them (frames are resized as they are decoded; the uint8 frames kept on the way add a "
         "quarter). Checked from the header's frame count and size before a frame is decoded; a larger video is "
         "a 400 naming the limit.")
envs.add("SGLANG_VIDEO_MAX_FRAME_PIXELS", 8192 * 8192, _parse_positive_int,
         "Largest video frame as decoded (width x height), checked from the header before each frame is decoded "
         "or converted; one full-size frame is held at a time. A larger frame is a 400 naming the limit.")
envs.add("SGLANG_VIDEO_CAP_PIXELS_PER_FRAME", False, _parse_bool,
         "Videos get transformers' cap_pixels_per_frame budget (qwen-vl-utils': each frame an even share of "
         "max_video_tokens) unless a request says otherwise; off: transformers' default, no clip-wide cap.")
envs.add("SGLANG_RESIZE_RESAMPLE", "", _parse_resample,
         "Upstream's image resize filter by PIL name: NEAREST, BOX, BILINEAR, HAMMING, BICUBIC or LANCZOS; unset: "
         "the model's preprocessor config (bicubic). Other than BICUBIC, JPEGs are not deferred to the GPU decoder.")

envs.add("SGLANG_GPU_IMAGE_DECODE", "auto", lambda raw: _parse_choice(raw, ("0", "1", "auto"), _BOOL_ALIASES),
         "JPEG images travel compressed: the tokenizer reads only the header (grid, placeholder count) and the "
         "vision side decodes, resizes, normalizes and patchifies them, batched with nvJPEG on CUDA or with PIL "
         "(bit-identical to the baseline) elsewhere (0: baseline, PIL in the tokenizer, float32 pixels sent; "
         "1: deferred everywhere; auto: deferred where the model runs on CUDA and torchvision is installed).")

envs.add("SGLANG_SAMPLER_BACKEND", "auto", lambda raw: _parse_choice(raw, ("auto", "triton", "torch")),
         "Next-token sampler: auto (the one-launch Triton kernel sgl_kernel.sampling.sample_from_logits for CUDA "
         "logits when triton and sgl_kernel import, else the torch path), triton (always the kernel; CPU tensors "
         "only under TRITON_INTERPRET=1) or torch (always the torch path).")
envs.add("SGLANG_GDN_BACKEND", "auto", lambda raw: _parse_choice(raw, ("auto", "triton", "torch")),
         "Qwen3.5's Gated DeltaNet layers: auto (sgl_kernel.gdn's Triton kernels, one batched call per op over "
         "the batch with states addressed in the state pool, for CUDA activations when triton and sgl_kernel "
         "import; else the per-request torch path), triton (always the kernels; CPU tensors only under "
         "TRITON_INTERPRET=1) or torch (always the per-request torch path). Read once when the model is built.")
envs.add("SGLANG_STOP_REGEX_TIMEOUT_MS", 100.0, float,
         "Time budget of one request's stop_regex search per output token (all its patterns together, in the "
         "scheduler); a search past it ends that request with a 400 naming the pattern. A stream's search for a "
         "partial match gets a tenth of it; past that the stream holds back its last 1024 characters instead.")


def main() -> None:
    for var in envs.all():
        print(f"{var.name}={var.get()!r}  (default {var.default!r})  {var.doc}")


if __name__ == "__main__":
    main()
