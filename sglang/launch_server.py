"""`python -m sglang.launch_server [ServerArgs flags]`: the OpenAI-compatible HTTP server."""

from __future__ import annotations

import logging
import signal
import sys


def _exit_on_signal(signum: int, frame) -> None:
    # Raised where the main thread is (model loading, or after uvicorn's own graceful shutdown
    # re-raises the signal), so the `finally` blocks kill the children and remove the ipc dir.
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs.from_argv(argv)
    logging.basicConfig(
        level=getattr(logging, server_args.log_level.upper()),
        format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _exit_on_signal)

    if server_args.encoder_only:  # encoder disaggregation: the vision tower alone (docs/optimizations/epd.md)
        from sglang.srt.entrypoints.encode_server import launch_encoder_server

        return launch_encoder_server(server_args)

    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.errors import StartupError

    try:
        return launch_server(server_args)
    except StartupError as e:  # the reason a child reported: one line, not a traceback of the barrier
        logging.getLogger("sglang.launch_server").error("start-up failed: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
