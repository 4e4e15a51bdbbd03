"""Process launch (schedulers, detokenizer, start-up barrier, shutdown) and the offline `Engine`.

`launch_subprocesses` is shared by the HTTP server and `Engine`. Children are spawned (never forked:
the parent may hold threads and an event loop), exit on their own when the parent dies, and are killed
by `shutdown_subprocesses`, which also removes the private ipc:// directory.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import logging
import multiprocessing as mp
import os
import shutil
import signal
import threading
import time
import weakref
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any, AsyncIterator, Callable, Iterator

from sglang.srt.server_args import PortArgs, ServerArgs

logger = logging.getLogger(__name__)

_TERMINATE_GRACE_S = 5.0


# ----------------------------------------------------------------------------- children
def _set_process_name(name: str) -> None:
    """Linux: shows in /proc/<pid>/comm, ps and top (15 bytes max)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _exit_with_parent(parent_pid: int, ipc_dir: str) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    shutil.rmtree(ipc_dir, ignore_errors=True)  # the parent could not clean up: it is gone
    os._exit(1)


def _child_main(name: str, target: Callable[..., None], args: tuple, parent_pid: int, ipc_dir: str, log_level: str):
    _set_process_name(name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent shuts us down
    logging.basicConfig(
        level=getattr(logging, log_level.upper()), format=f"[%(asctime)s {name}] %(levelname)s %(name)s: %(message)s"
    )
    threading.Thread(target=_exit_with_parent, args=(parent_pid, ipc_dir), daemon=True).start()
    target(*args)


def _scheduler_target(server_args: ServerArgs, port_args: PortArgs, tp_rank: int, ready_writer) -> None:
    from sglang.srt.managers.scheduler import run_scheduler_process

    run_scheduler_process(server_args, port_args, tp_rank, ready_writer)


def _replica_scheduler_target(server_args: ServerArgs, port_args: PortArgs, tp_rank: int, dp_rank: int,
                              ready_writer) -> None:
    from sglang.srt.managers.scheduler import run_scheduler_process

    run_scheduler_process(server_args, port_args, tp_rank, ready_writer, dp_rank)


def _dp_controller_target(server_args: ServerArgs, port_args: PortArgs, ready_writer) -> None:
    from sglang.srt.managers.data_parallel_controller import run_data_parallel_controller_process

    run_data_parallel_controller_process(server_args, port_args, ready_writer)


def _detokenizer_target(server_args: ServerArgs, port_args: PortArgs, ready_writer) -> None:
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process

    run_detokenizer_process(server_args, port_args, ready_writer)


def _check_quantization(server_args: ServerArgs) -> None:
    """A quantized checkpoint or --quantization that cannot be served is refused here in one line, before
    any scheduler loads weights."""
    import json

    from sglang.srt.layers.quantization import startup_problem

    with open(os.path.join(server_args.model_path, "config.json")) as f:
        raw = json.load(f)
    flag = None if server_args.quantization in (None, "", "none") else server_args.quantization
    problem = startup_problem(raw, flag, server_args.tp_size)
    if problem:
        raise ValueError(problem)


def launch_subprocesses(server_args: ServerArgs, start_timeout: float | None = None):
    """Spawns one scheduler per TP rank (per data-parallel replica, with the data-parallel controller at
    --dp-size > 1) and the detokenizer, waits until all are ready, and returns
    `(tokenizer_manager, processes, port_args)`. The tokenizer manager is not started yet: call
    `await tokenizer_manager.start(processes, on_child_death)` on the event loop that will serve it."""
    from sglang.srt.managers.io_struct import SchedulerReady
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    # Resolve once here, so children never each generate the embedded default model.
    server_args = dataclasses.replace(server_args, model_path=server_args.resolved_model_path())
    from sglang.srt.server_args_checks import log_ignored_flags

    log_ignored_flags(server_args, server_args.resolved_device())
    _check_quantization(server_args)
    if server_args.mm_feature_transport in ("cpu", "cuda_ipc"):  # cuda_ipc: its release board, shm fallbacks
        from sglang.srt.multimodal.transport.shm import cleanup_stale_segments

        removed = cleanup_stale_segments(server_args.port)
        if removed:
            logger.warning("removed %d shared-memory segments left by an earlier run on port %d", removed, server_args.port)
    port_args = PortArgs.create(server_args)
    ctx = mp.get_context("spawn")
    procs: list[BaseProcess] = []
    readers: dict[Any, BaseProcess] = {}

    def spawn(name: str, target: Callable[..., None], args: tuple) -> None:
        reader, writer = ctx.Pipe(duplex=False)
        p = ctx.Process(
            target=_child_main,
            args=(name, target, (*args, writer), os.getpid(), port_args.ipc_dir, server_args.log_level),
            name=name,
            daemon=False,  # a scheduler may need children of its own; shutdown_subprocesses reaps them
        )
        p.start()
        writer.close()
        procs.append(p)
        readers[reader] = p

    try:
        if server_args.dp_size == 1:
            for rank in server_args.local_tp_ranks():
                spawn(f"sglang-sched{rank}", _scheduler_target, (server_args, port_args, rank))
        else:  # every replica's schedulers and the controller are children of this process: one watchdog
            for dp_rank in range(server_args.dp_size):
                for rank in server_args.local_tp_ranks():
                    spawn(f"sglang-dp{dp_rank}-tp{rank}", _replica_scheduler_target,
                          (server_args, port_args.for_replica(dp_rank), rank, dp_rank))
            spawn("sglang-dpctl", _dp_controller_target, (server_args, port_args))
        if server_args.node_rank != 0:  # worker node: its scheduler ranks only; node 0 serves requests
            ready = _wait_ready(readers, start_timeout)
            return None, procs, port_args
        spawn("sglang-detok", _detokenizer_target, (server_args, port_args))
        ready = _wait_ready(readers, start_timeout)
        # every replica reports; the tokenizer checks prompts against the smallest KV cache among them
        scheduler_info = min((m for m in ready if isinstance(m, SchedulerReady)),
                             key=lambda m: m.max_total_num_tokens, default=None)
        if scheduler_info is None:
            raise RuntimeError("no scheduler reported ready")
        tokenizer_manager = TokenizerManager(server_args, port_args, scheduler_info)
    except BaseException:
        shutdown_subprocesses(procs, port_args)
        raise
    logger.info(
        "engine ready: %d scheduler(s)%s, KV cache %d tokens, context length %d",
        server_args.tp_size * server_args.dp_size,
        f" in {server_args.dp_size} data-parallel replicas" if server_args.dp_size > 1 else "",
        scheduler_info.max_total_num_tokens, scheduler_info.context_length,
    )
    return tokenizer_manager, procs, port_args


def _wait_ready(readers: dict[Any, BaseProcess], timeout: float | None) -> list[Any]:
    """The start-up barrier: one message per child. A child that reports an error, or exits (before or
    after reporting), fails the launch with its reason."""
    from sglang.srt.managers.io_struct import SchedulerDied

    deadline = None if timeout is None else time.monotonic() + timeout
    pending = dict(readers)
    by_sentinel = {p.sentinel: (r, p) for r, p in readers.items()}
    messages = []
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if left == 0.0:
            raise RuntimeError(f"start-up timed out after {timeout:g} s waiting for {', '.join(p.name for p in pending.values())}")
        ready = wait(list(pending) + list(by_sentinel), timeout=left)
        for obj in sorted(ready, key=lambda o: o not in pending):  # messages before exits
            if obj in pending:
                p = pending.pop(obj)
                try:
                    msg = obj.recv()
                except EOFError:
                    p.join(timeout=5)
                    raise RuntimeError(f"{p.name} exited during start-up with exit code {p.exitcode}") from None
                if isinstance(msg, SchedulerDied):
                    raise RuntimeError(f"{p.name}: {msg.message}")
                if isinstance(msg, tuple) and msg[0] == "error":
                    raise RuntimeError(f"{p.name}: {msg[1]}")
                messages.append(msg)
            elif obj in by_sentinel:
                reader, p = by_sentinel[obj]
                if reader in pending and reader.poll():
                    continue  # its last words are in the pipe: read them on the next pass
                p.join(timeout=5)
                raise RuntimeError(f"{p.name} exited during start-up with exit code {p.exitcode}")
    return messages


def shutdown_subprocesses(procs: list[BaseProcess], port_args: PortArgs | None) -> None:
    """SIGTERM, then SIGKILL after a grace period; reaps every child and removes the ipc directory."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _TERMINATE_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)
    if port_args is not None:
        shutil.rmtree(port_args.ipc_dir, ignore_errors=True)


# ----------------------------------------------------------------------------- offline engine
class Engine:
    """In-process engine: the same scheduler and detokenizer processes as the server, without HTTP.

    `generate` takes one prompt (or message list) or a batch (a list of them) and returns
    `{"text", "output_ids", "meta_info"}` dicts; `stream=True` returns an iterator of cumulative
    chunks (for a batch or n > 1, every request's chunks as they come, tagged "index").
    `async_generate` takes the same arguments from the caller's own event loop. Use as a context
    manager or call `shutdown()`; it also runs at exit.
    Children are spawned, so a script creating an Engine needs the `if __name__ == "__main__":` guard."""

    def __init__(self, model_path: str | None = None, **kwargs: Any):
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        self._closed = False
        self.tokenizer_manager, self._procs, self._port_args = launch_subprocesses(self.server_args)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sglang-engine-loop", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _shutdown_engine, self._loop, self._thread,
                                           self.tokenizer_manager, self._procs, self._port_args)
        # Registered after multiprocessing's own exit hook, so it runs first (LIFO) and shuts the
        # children down in order instead of leaving them to be terminated mid-request.
        atexit.register(self._finalizer)
        self._run(self.tokenizer_manager.start(self._procs))

    def _submit(self, coro):
        """`coro` scheduled on the engine's loop: a concurrent.futures.Future of its result."""
        if self._closed:
            coro.close()
            raise RuntimeError("the engine is shut down")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro):
        return self._submit(coro).result()

    def generate(
        self,
        prompt: str | list[str] | None = None,
        messages: list[dict] | list[list[dict]] | None = None,
        image_data: Any = None,
        sampling_params: dict | list[dict] | None = None,
        stream: bool = False,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        video_data: Any = None,
        priority: int | list[int] | None = None,
        images_config: dict | None = None,
        mm_processor_kwargs: dict | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """`return_logprob`, `logprob_start_len`, `top_logprobs_num`: upstream's keyword arguments; they
        join every request's sampling parameters (meta_info then holds output_token_logprobs, and
        input_token_logprobs from logprob_start_len on). `video_data`: like `image_data` (one prompt: a video
        or a list of videos, each a URL, path, base64, bytes or a list of frames; a batch: one entry per prompt).
        `priority` (one, or one per prompt; with --enable-priority-scheduling), `images_config` (upstream) or
        `mm_processor_kwargs` (vLLM): as on /generate."""
        objs, as_list = self._requests(prompt, messages, image_data, sampling_params, stream, input_ids,
                                       return_logprob, logprob_start_len, top_logprobs_num, video_data,
                                       _Options(priority, images_config, mm_processor_kwargs))
        if stream:
            return self._stream(objs)
        return self._run(self._collect_batch(objs) if as_list else self._collect(objs[0]))

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        messages: list[dict] | list[list[dict]] | None = None,
        image_data: Any = None,
        sampling_params: dict | list[dict] | None = None,
        stream: bool = False,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        video_data: Any = None,
        priority: int | list[int] | None = None,
        images_config: dict | None = None,
        mm_processor_kwargs: dict | None = None,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """`generate` for callers on their own event loop (upstream's name): awaits the same outputs
        without blocking that loop; with `stream=True` it returns an async iterator of the chunks."""
        objs, as_list = self._requests(prompt, messages, image_data, sampling_params, stream, input_ids,
                                       return_logprob, logprob_start_len, top_logprobs_num, video_data,
                                       _Options(priority, images_config, mm_processor_kwargs))
        if stream:
            return self._astream(objs)
        return await asyncio.wrap_future(self._submit(self._collect_batch(objs) if as_list else self._collect(objs[0])))

    def _requests(self, prompt, messages, image_data, sampling_params, stream, input_ids, return_logprob,
                  logprob_start_len, top_logprobs_num, video_data=None, options: "_Options | None" = None
                  ) -> tuple[list, bool]:
        """(the requests to run: one per prompt and sample, whether the caller gets a list)."""
        from sglang.srt.entrypoints.openai.protocol import pick_media_settings
        from sglang.srt.managers.io_struct import GenerateReqInput

        options = options or _Options()
        media_kwargs, media_kwargs_name = pick_media_settings(options.mm_processor_kwargs, options.images_config)

        logprob_kw = {k: v for k, v in (("logprob_start_len", logprob_start_len), ("top_logprobs_num", top_logprobs_num))
                      if v is not None}
        if return_logprob:
            logprob_kw["return_logprob"] = True
        if logprob_kw:
            sampling_params = ([{**(p or {}), **logprob_kw} for p in sampling_params] if isinstance(sampling_params, list)
                               else {**(sampling_params or {}), **logprob_kw})

        batch = isinstance(prompt, list) or (input_ids and isinstance(input_ids[0], list)) or (
            messages and isinstance(messages[0], list)
        )
        if not batch:
            if isinstance(options.priority, list):
                raise ValueError("priority is one integer for one prompt")
            obj = GenerateReqInput(text=prompt, input_ids=input_ids, messages=messages,
                                   image_data=_as_image_list(image_data), video_data=_as_image_list(video_data),
                                   sampling_params=dict(sampling_params or {}), stream=stream,
                                   priority=options.priority, mm_processor_kwargs=media_kwargs,
                                   mm_kwargs_name=media_kwargs_name)
            copies = obj.parallel_copies()
            return copies, len(copies) > 1
        n = len(prompt if isinstance(prompt, list) else input_ids if input_ids else messages)
        per_images = list(image_data) if image_data is not None else [None] * n
        per_params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * n
        per_videos = list(video_data) if video_data is not None else [None] * n
        if len(per_images) != n or len(per_params) != n or len(per_videos) != n:
            raise ValueError(f"a batch of {n} requests needs {n} image_data, video_data and sampling_params entries")
        per_priority = options.priority if isinstance(options.priority, list) else [options.priority] * n
        if len(per_priority) != n:
            raise ValueError(f"a batch of {n} requests needs priority as one integer or a list of {n}")
        objs = [
            GenerateReqInput(text=prompt[i] if prompt else None, input_ids=input_ids[i] if input_ids else None,
                             messages=messages[i] if messages else None, image_data=_as_image_list(per_images[i]),
                             video_data=_as_image_list(per_videos[i]),
                             sampling_params=dict(per_params[i] or {}), stream=stream, priority=per_priority[i],
                             mm_processor_kwargs=media_kwargs, mm_kwargs_name=media_kwargs_name)
            for i in range(n)
        ]
        return [c for o in objs for c in o.parallel_copies()], True

    async def _collect(self, obj) -> dict:
        out = None
        async for out in self.tokenizer_manager.generate_request(obj):
            pass
        return out

    async def _collect_batch(self, objs) -> list[dict]:
        return list(await asyncio.gather(*(self._collect(o) for o in objs)))

    def _chunks(self, objs) -> AsyncIterator[dict]:
        """Cumulative chunks of one request (only what is new in each with --stream-output); of several (a
        batch, n samples), every request's chunks as they come, each tagged "index" as /generate tags them.
        Runs on the engine's loop."""
        from sglang.srt.entrypoints.native_generate import stream_deltas
        from sglang.srt.entrypoints.openai.serving_base import indexed_chunks, merge_streams

        tm = self.tokenizer_manager
        if len(objs) == 1:
            chunks = tm.generate_request(objs[0])
        else:
            chunks = indexed_chunks(merge_streams([tm.generate_request(o) for o in objs]))
        return stream_deltas(chunks) if self.server_args.stream_output else chunks

    def _stream(self, objs) -> Iterator[dict]:
        agen = self._chunks(objs)
        try:
            while True:
                try:
                    yield self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(agen.aclose())  # aborts the request when the caller stops early

    async def _astream(self, objs) -> AsyncIterator[dict]:
        agen = self._chunks(objs)
        try:
            while True:
                try:
                    yield await asyncio.wrap_future(self._submit(agen.__anext__()))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                await asyncio.wrap_future(self._submit(agen.aclose()))  # aborts an unfinished request

    def flush_cache(self) -> bool:
        return self._run(self.tokenizer_manager.flush_cache()).success

    def get_server_info(self) -> dict:
        return {**dataclasses.asdict(self.server_args), **self._run(self.tokenizer_manager.get_server_info())}

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _shutdown_engine(loop, thread, tokenizer_manager, procs, port_args) -> None:
    if thread.is_alive():
        try:
            asyncio.run_coroutine_threadsafe(tokenizer_manager.close(), loop).result(timeout=10)
        except Exception:  # noqa: BLE001  (shutdown must go on)
            logger.exception("closing the tokenizer manager failed")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    shutdown_subprocesses(procs, port_args)


@dataclasses.dataclass(frozen=True)
class _Options:
    """Per-request options of generate() beyond the prompt, media and sampling parameters."""

    priority: int | list[int] | None = None
    images_config: dict | None = None
    mm_processor_kwargs: dict | None = None


def _as_image_list(image_data: Any) -> list[Any]:
    if image_data is None:
        return []
    return list(image_data) if isinstance(image_data, (list, tuple)) else [image_data]
