"""Grid specs -> configurations.

One `--grid` spec is `NAME=V1,V2,...`:
- NAME is a server flag without or with its leading dashes (`chunked-prefill-size`, `--page-size`,
  underscores accepted), or an environment variable of the server (all capitals: `SGLANG_MM_SHM_TRANSPORT`);
- values are split on `|` when the list has one (so a value may hold commas: `cuda-graph-bs=1,2,4|1,2,4,8`;
  a single such value ends with `|`: `cuda-graph-bs=1,2,4|`), else on `,`; a value with spaces becomes several words (`cuda-graph-bs=1 2 4,8 16`);
- a bare flag (`--disable-radix-cache`) takes on/off (also true/false, yes/no, 1/0): on passes the flag;
- the value `default` leaves the flag (or the variable) out, so the server's default is one of the points.

The configurations are the cartesian product of the specs, the first spec varying slowest. Every one is checked
against the server's own parser before anything starts.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import itertools
import re
from dataclasses import dataclass
from typing import Iterable

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
FLAG_NAME = re.compile(r"^[a-z][a-z0-9]*(?:-[a-z0-9]+)*$")
ON = ("on", "true", "yes", "1")
OFF = ("off", "false", "no", "0")
DEFAULT = "default"
# Set by the tuner itself for every configuration: a grid over them would not mean anything.
RESERVED = ("port", "host", "model-path")


class GridError(ValueError):
    """A grid spec or configuration the tuner cannot run; the message is one line for the user."""


@dataclass(frozen=True)
class Axis:
    name: str  # flag name without dashes, or an environment variable
    values: tuple[str, ...]

    @property
    def is_env(self) -> bool:
        return bool(ENV_NAME.match(self.name))


@dataclass(frozen=True)
class Config:
    """One point of the grid: (name, value) pairs in spec order."""
    items: tuple[tuple[str, str], ...]

    @property
    def key(self) -> str:
        """Stable identity in the results file, e.g. `chunked-prefill-size=2048 disable-radix-cache=on`."""
        return " ".join(f"{n}={v}" for n, v in self.items) or "(server defaults)"

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)


def normalize_name(raw: str) -> str:
    name = raw.strip()
    if ENV_NAME.match(name):
        return name
    name = name.lstrip("-").replace("_", "-").lower()
    if not FLAG_NAME.match(name):
        raise GridError(f"--grid {raw!r}: not a flag name (e.g. chunked-prefill-size) or an environment variable")
    return name


def split_values(raw: str) -> tuple[str, ...]:
    parts = raw.split("|") if "|" in raw else raw.split(",")
    if "|" in raw and raw.endswith("|"):  # `NAME=1,2,4|`: one value holding commas
        parts = parts[:-1]
    values = tuple(" ".join(p.split()) for p in parts)
    if not values or any(not v for v in values):
        raise GridError(f"empty value in {raw!r}")
    if len(set(values)) != len(values):
        raise GridError(f"repeated value in {raw!r}")
    return values


def parse_axis(spec: str) -> Axis:
    name, sep, values = spec.partition("=")
    if not sep:
        raise GridError(f"--grid {spec!r}: expected NAME=V1,V2,...")
    try:
        return Axis(normalize_name(name), split_values(values))
    except GridError as e:
        raise GridError(f"--grid {spec!r}: {e}") from None


def format_axis(axis: Axis) -> str:
    """The spec `parse_axis` reads back as `axis`."""
    if not any("," in v for v in axis.values):
        return f"{axis.name}={','.join(axis.values)}"
    return f"{axis.name}={'|'.join(axis.values)}" + ("|" if len(axis.values) == 1 else "")


def parse_grid(specs: Iterable[str]) -> list[Axis]:
    axes: list[Axis] = []
    for spec in specs:
        axis = parse_axis(spec)
        if any(a.name == axis.name for a in axes):
            raise GridError(f"--grid {axis.name} given twice; put all its values in one spec")
        axes.append(axis)
    return axes


def expand(axes: list[Axis]) -> list[Config]:
    """The cartesian product, first axis slowest; no axes: one configuration (the server's defaults)."""
    return [Config(tuple(zip((a.name for a in axes), combo))) for combo in itertools.product(*(a.values for a in axes))]


# ----------------------------------------------------------------------------- the server's flags
def server_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="python -m sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def flag_kinds(parser: argparse.ArgumentParser | None = None) -> dict[str, str]:
    """Flag name (no dashes) -> "bool" (bare), "multi" (several words) or "value"."""
    parser = parser or server_parser()
    kinds = {}
    for action in parser._actions:
        for opt in action.option_strings:
            if not opt.startswith("--"):
                continue
            if isinstance(action, argparse._StoreTrueAction):
                kinds[opt[2:]] = "bool"
            else:
                kinds[opt[2:]] = "multi" if action.nargs == "+" else "value"
    return kinds


def bool_value(name: str, value: str) -> bool:
    v = value.lower()
    if v in ON:
        return True
    if v in OFF or v == DEFAULT:
        return False
    raise GridError(f"--grid {name}: a bare flag takes on/off, got {value!r}")


def config_argv(config: Config, kinds: dict[str, str]) -> list[str]:
    """The server flags of a configuration (environment variables excluded)."""
    argv: list[str] = []
    for name, value in config.items:
        if ENV_NAME.match(name) or value == DEFAULT:
            continue
        kind = kinds.get(name, "value")
        if kind == "bool":
            if bool_value(name, value):
                argv.append(f"--{name}")
        elif kind == "multi":
            argv += [f"--{name}", *value.split()]
        else:
            argv += [f"--{name}", value]
    return argv


def config_env(config: Config) -> dict[str, str]:
    return {n: v for n, v in config.items if ENV_NAME.match(n) and v != DEFAULT}


def _flags_in(argv: list[str]) -> set[str]:
    return {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}


def check_server_argv(argv: list[str], parser: argparse.ArgumentParser | None = None) -> None:
    """Raises GridError with the server parser's own message when `argv` would not start a server."""
    from sglang.srt.server_args import ServerArgs

    parser = parser or server_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
        ServerArgs.from_cli_args(ns)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        raise GridError(lines[-1] if lines else f"invalid server arguments {argv}") from None
    except ValueError as e:
        raise GridError(str(e)) from None


def validate(axes: list[Axis], configs: list[Config], base_argv: list[str]) -> dict[str, str]:
    """Checks names, bare-flag values, clashes with --server-args and every configuration's full command line.
    Returns the flag kinds."""
    parser = server_parser()
    kinds = flag_kinds(parser)
    base_flags = _flags_in(base_argv)
    for axis in axes:
        if axis.is_env:
            continue
        if axis.name in RESERVED:
            raise GridError(f"--grid {axis.name}: set by the tuner (use --model-path for the model)")
        if axis.name not in kinds:
            close = difflib.get_close_matches(axis.name, list(kinds), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise GridError(f"--grid {axis.name}: not a server flag (python -m sglang.launch_server --help){hint}")
        if axis.name in base_flags:
            raise GridError(f"--grid {axis.name} is also in --server-args; give it in one place")
        if kinds[axis.name] == "bool":
            for v in axis.values:
                bool_value(axis.name, v)
    for flag in base_flags & set(RESERVED[:2]):
        raise GridError(f"--server-args --{flag}: set by the tuner")
    for config in configs:
        try:
            check_server_argv(base_argv + config_argv(config, kinds), parser)
        except GridError as e:
            raise GridError(f"configuration [{config.key}]: {e}") from None
    return kinds
