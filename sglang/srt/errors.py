"""Errors a request can end with before or while it is served, carrying the HTTP answer.

Raised on the tokenizer side (validation, media, shutdown) and turned into responses by the API layer."""

from __future__ import annotations


class GenerateError(Exception):
    """A request that cannot be served; `status_code` is the HTTP status to answer with."""

    def __init__(self, message: str, status_code: int = 400, err_type: str = "invalid_request_error"):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.err_type = err_type


class ServerUnhealthyError(GenerateError):
    def __init__(self, message: str):
        super().__init__(message, 503, "service_unavailable")


class ServeRefusal(ValueError):
    """What the engine refuses to serve, found while starting (a config, a checkpoint, a scale file): the
    message names the problem in one line, so start-up prints it without a traceback."""


class StartupError(RuntimeError):
    """Start-up failed for the reason in the message (a child reported it or exited): printed as one line."""
