import dataclasses

from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.secrets import REDACTED, SECRET_FIELDS, redact_secrets


def test_a_set_api_key_is_redacted_and_an_unset_one_stays_none():
    shown = redact_secrets(dataclasses.asdict(ServerArgs(api_key="sk-very-secret")))
    assert shown["api_key"] == REDACTED and "sk-very-secret" not in repr(shown)
    assert redact_secrets(dataclasses.asdict(ServerArgs()))["api_key"] is None


def test_every_secret_field_is_a_server_arg():
    assert set(SECRET_FIELDS) <= {f.name for f in dataclasses.fields(ServerArgs)}
