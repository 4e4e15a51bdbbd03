"""A generation's outputs as the HTTP handlers consume them: drained to the last, gathered or merged across
the samples and prompts of one call, held until the first output (so that a refusal before running is the
response's status), and watched for the client going away (which aborts the request)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, TypeVar

from fastapi import Request

from sglang.srt.errors import GenerateError

T = TypeVar("T")


async def drain(outputs: AsyncIterator[T]) -> T | None:
    """The last item of `outputs` (None if it yields nothing)."""
    last = None
    async for last in outputs:
        pass
    return last


async def gather_finals(streams: list[AsyncIterator[T]]) -> AsyncIterator[list[T | None]]:
    """Drains every stream concurrently and yields their last items once, in order (a one-item
    iterator, so it can be handed to `collect_until_disconnect`); cancelling it cancels them all."""
    tasks = [asyncio.ensure_future(drain(s)) for s in streams]
    try:
        yield list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()


async def merge_streams(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several streams as they come, tagged with the stream's index. A failing stream ends
    the merge with its error; closing the merge closes (and so aborts) every stream."""
    if len(streams) == 1:  # the common case: no tasks in between
        try:
            async for item in streams[0]:
                yield 0, item
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item, None))
        except BaseException as e:  # noqa: BLE001 (handed to the consumer, cancellation included)
            await queue.put((i, done, e))
            return
        await queue.put((i, done, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(streams)
        while live:
            i, item, err = await queue.get()
            if item is done:
                if err is not None and not isinstance(err, asyncio.CancelledError):
                    raise err
                live -= 1
                continue
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for st in streams:
            await st.aclose()


async def _resumed(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


class ClientGone(Exception):
    """The client disconnected while its stream was held (its requests are aborted)."""


async def hold_for_first_output(request: Request | None, streams: list[AsyncIterator[T]]) -> list[AsyncIterator[T]]:
    """Streams held until every one has its first output, so that what the scheduler decides about a
    request before it runs (a grammar that fails to compile on its ranks, a full queue under
    --max-queued-requests, a prompt its KV budget refuses) is the response's status (400, 503), not a
    200 whose stream ends in an error event. The headers go out with the first token; nothing a stream
    yields is lost. On an error every stream is closed (aborting the others) and the first prompt's
    error is raised; a client that leaves while held has its requests aborted (ClientGone)."""
    # every stream is started (a prepared request not started would stay registered as preparing)
    firsts_task = asyncio.ensure_future(asyncio.gather(*(s.__anext__() for s in streams), return_exceptions=True))
    disconnect = asyncio.ensure_future(_wait_disconnect(request)) if request is not None else None
    try:
        await asyncio.wait({firsts_task} | ({disconnect} if disconnect else set()), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if disconnect is not None:
            disconnect.cancel()
    if not firsts_task.done():
        firsts_task.cancel()
        await asyncio.wait({firsts_task})
        for s in streams:
            await s.aclose()
        raise ClientGone()
    firsts = firsts_task.result()
    failed = next((f for f in firsts if isinstance(f, BaseException)), None)
    if failed is not None:
        for s in streams:
            await s.aclose()
        if isinstance(failed, StopAsyncIteration):  # a generation always yields its final output
            raise GenerateError("the request ended without an output", 500, "server_error")
        raise failed
    return [_resumed(f, s) for f, s in zip(firsts, streams)]


async def indexed_chunks(merged: AsyncIterator[tuple[int, dict[str, Any]]]) -> AsyncIterator[dict[str, Any]]:
    """Chunks of several native streams (/generate or Engine: a batch, n samples, or both) as they
    come, each tagged with "index": its request's position in the expanded list (prompts in order,
    each prompt's samples together: with one n for all, prompt p sample j is p * n + j). Closing this
    closes the merge, which aborts every unfinished request."""
    try:
        async for i, out in merged:
            yield {**out, "index": i}
    finally:
        await merged.aclose()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def collect_until_disconnect(request: Request, outputs: AsyncIterator[T]) -> T | None:
    """The last output of `outputs`, or None if the client disconnected first (the draining task is
    cancelled, which aborts the request)."""
    task = asyncio.ensure_future(drain(outputs))
    disconnect = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler itself was cancelled (shutdown)
        task.cancel()
        raise
    finally:
        disconnect.cancel()
    if not task.done():  # the client went away first
        task.cancel()
        await asyncio.wait({task})  # let the cancellation (the abort) run before answering
        return None
    return task.result()
