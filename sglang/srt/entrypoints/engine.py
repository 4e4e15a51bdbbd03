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

from sglang.srt.entrypoints.engine_requests import EngineOptions, engine_request_groups
from sglang.srt.errors import StartupError
from sglang.srt.server_args import PortArgs, ServerArgs
from sglang.srt.utils.process_name import set_process_name

logger = logging.getLogger(__name__)

_TERMINATE_GRACE_S = 5.0


# ----------------------------------------------------------------------------- children
def _set_process_name(name: str) -> None:
    """Linux: shows in /proc/<pid>/comm, ps and top (15 bytes max)."""
    set_process_name(name)


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
    problem = startup_problem(raw, flag, server_args.tp_size, server_args.ep_size)
    if problem:
        raise ValueError(problem)


def launch_subprocesses(server_args: ServerArgs, start_timeout: float | None = None):
    """Spawns one scheduler per TP rank (per data-parallel replica, with the data-parallel controller at
    --dp-size > 1) and the detokenizer, waits until all are ready, and returns
    `(tokenizer_manager, processes, port_args)`. The tokenizer manager is not started yet: call
    `await tokenizer_manager.start(processes, on_child_death)` on the event loop that will serve it."""
    from sglang.srt.managers.io_struct import SchedulerReady
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    if server_args.encoder_only:
        raise ValueError("--encoder-only serves the vision tower alone, over HTTP for language servers: start it "
                         "with python -m sglang.launch_server --encoder-only (sglang.Engine runs language models)")
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
    mm_pool = None  # --mm-processor-worker-num: started first, so the workers load while the schedulers do

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
        if server_args.node_rank == 0:
            from sglang.srt.multimodal.mm_worker_plan import start_worker_pool

            mm_pool = start_worker_pool(server_args, server_args.model_path)
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
        tokenizer_manager = TokenizerManager(server_args, port_args, scheduler_info, mm_pool)
    except BaseException:
        if mm_pool is not None:
            mm_pool.close()
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
            raise StartupError(f"start-up timed out after {timeout:g} s waiting for {', '.join(p.name for p in pending.values())}")
        ready = wait(list(pending) + list(by_sentinel), timeout=left)
        for obj in sorted(ready, key=lambda o: o not in pending):  # messages before exits
            if obj in pending:
                p = pending.pop(obj)
                try:
                    msg = obj.recv()
                except EOFError:
                    p.join(timeout=5)
                    raise StartupError(f"{p.name} exited during start-up with exit code {p.exitcode}") from None
                if isinstance(msg, SchedulerDied):
                    raise StartupError(f"{p.name}: {msg.message}")
                if isinstance(msg, tuple) and msg[0] == "error":
                    raise StartupError(f"{p.name}: {msg[1]}")
                messages.append(msg)
            elif obj in by_sentinel:
                reader, p = by_sentinel[obj]
                if reader in pending and reader.poll():
                    continue  # its last words are in the pipe: read them on the next pass
                p.join(timeout=5)
                raise StartupError(f"{p.name} exited during start-up with exit code {p.exitcode}")
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
    chunks (for a batch or n > 1, every request's chunks as they come, tagged "index"). With n > 1 a
    prompt is built once (its images or videos fetched, decoded, hashed and put in shared memory once)
    and its other samples cloned, as the HTTP routes do (`TokenizerManager.tokenize_requests`).
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
        custom_logit_processor: str | list[str | None] | None = None,
    ) -> dict | list[dict] | Iterator[dict]:
        """`return_logprob`, `logprob_start_len`, `top_logprobs_num`: upstream's keyword arguments; they
        join every request's sampling parameters (meta_info then holds output_token_logprobs, and
        input_token_logprobs from logprob_start_len on). `video_data`: like `image_data` (one prompt: a video
        or a list of videos, each a URL, path, base64, bytes or a list of frames; a batch: one entry per prompt).
        `priority` (one, or one per prompt; with --enable-priority-scheduling), `images_config` (upstream) or
        `mm_processor_kwargs` (vLLM), `custom_logit_processor` (one, or one per prompt; with
        --enable-custom-logit-processor, its values in sampling_params["custom_params"]): as on /generate."""
        objs, as_list = self._requests(prompt, messages, image_data, sampling_params, stream, input_ids,
                                       return_logprob, logprob_start_len, top_logprobs_num, video_data,
                                       EngineOptions(priority, images_config, mm_processor_kwargs, custom_logit_processor))
        if stream:
            return self._stream(objs)
        return self._run(self._collect(objs, as_list))

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
        custom_logit_processor: str | list[str | None] | None = None,
    ) -> dict | list[dict] | AsyncIterator[dict]:
        """`generate` for callers on their own event loop (upstream's name): awaits the same outputs
        without blocking that loop; with `stream=True` it returns an async iterator of the chunks."""
        objs, as_list = self._requests(prompt, messages, image_data, sampling_params, stream, input_ids,
                                       return_logprob, logprob_start_len, top_logprobs_num, video_data,
                                       EngineOptions(priority, images_config, mm_processor_kwargs, custom_logit_processor))
        if stream:
            return self._astream(objs)
        return await asyncio.wrap_future(self._submit(self._collect(objs, as_list)))

    def _requests(self, prompt, messages, image_data, sampling_params, stream, input_ids, return_logprob,
                  logprob_start_len, top_logprobs_num, video_data=None, options: "EngineOptions | None" = None
                  ) -> tuple[list, bool]:
        """(the requests to run: one group per prompt, its `n` samples; whether the caller gets a list)."""
        return engine_request_groups(prompt, messages, image_data, sampling_params, stream, input_ids, return_logprob,
                                     logprob_start_len, top_logprobs_num, video_data, options)

    async def _generations(self, groups) -> list[AsyncIterator[dict]]:
        """Each prompt prepared once and its other samples cloned with their own rid and seed (media
        fetched, decoded, hashed and written to shared memory once per prompt), the prompts concurrently:
        the tokenizer manager's `tokenize_requests`, as /generate and the OpenAI routes use it. Then one
        generation per sample, in prompt-major order."""
        tm = self.tokenizer_manager
        return [tm.generate_tokenized(t, p) for t, p in await tm.tokenize_requests(groups)]

    async def _collect(self, groups, as_list: bool) -> dict | list[dict]:
        from sglang.srt.entrypoints.openai.streams import drain

        outs = await asyncio.gather(*(drain(g) for g in await self._generations(groups)))
        return list(outs) if as_list else outs[0]

    async def _chunks(self, groups) -> AsyncIterator[dict]:
        """Cumulative chunks of one request (only what is new in each with --stream-output); of several (a
        batch, n samples), every request's chunks as they come, each tagged "index" as /generate tags them.
        Runs on the engine's loop; closing it aborts every unfinished request."""
        from sglang.srt.entrypoints.native_generate import stream_deltas
        from sglang.srt.entrypoints.openai.streams import indexed_chunks, merge_streams

        streams = await self._generations(groups)
        chunks = streams[0] if len(streams) == 1 else indexed_chunks(merge_streams(streams))
        if self.server_args.stream_output:
            chunks = stream_deltas(chunks)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

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

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None, abort_all_requests: bool = False,
                                 weight_version: str | None = None, flush_cache: bool = True) -> tuple[bool, str, int]:
        """(success, message, num_paused_requests) as upstream's Engine; as POST /update_weights_from_disk."""
        return (*self._run(self.tokenizer_manager.update_weights_from_disk(
            model_path, load_format, abort_all_requests, weight_version, flush_cache)), 0)

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
