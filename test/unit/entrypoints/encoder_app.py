"""An `--encoder-only` server's HTTP app running in a thread of the test process (the tower loaded once per
test module, the app reached over real HTTP on a loopback port)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator


@contextlib.contextmanager
def encoder_in_thread(model_path: str, **server_args) -> Iterator[tuple[object, str]]:
    """(EncoderEngine, base URL) while the app serves; stopped and closed on exit."""
    import uvicorn

    from sglang.srt.entrypoints.encode_server import EncoderEngine, create_encoder_app
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.network import pick_unused_port

    port = pick_unused_port()
    args = ServerArgs(model_path=model_path, encoder_only=True, dtype="float32", device="cpu", port=port,
                      **server_args)
    engine = EncoderEngine(args)
    server = uvicorn.Server(uvicorn.Config(create_encoder_app(engine, args.api_key), host="127.0.0.1", port=port,
                                           log_level="warning", loop="asyncio", http="h11"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:  # uvicorn sets it once the socket listens
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the encoder app did not start")
            time.sleep(0.05)
        yield engine, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        engine.close()
