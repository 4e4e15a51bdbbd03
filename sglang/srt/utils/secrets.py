"""Server settings that must never leave the process: no route, log line or report echoes them."""

from __future__ import annotations

from typing import Any

# ServerArgs fields holding credentials
SECRET_FIELDS = ("api_key",)
REDACTED = "<redacted>"


def redact_secrets(settings: dict[str, Any]) -> dict[str, Any]:
    """A copy of `settings` with every secret that is set replaced by REDACTED (unset ones stay None,
    so a client can still tell whether the server asks for a key)."""
    return {k: (REDACTED if k in SECRET_FIELDS and v is not None else v) for k, v in settings.items()}
