"""The package version, in a module of its own so the server can report it without importing the package's
entry points (`sglang/__init__.py` re-exports it)."""

__version__ = "0.1.0"
