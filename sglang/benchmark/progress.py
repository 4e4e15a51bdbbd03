"""A progress bar: tqdm where it is installed, else a plain one-line counter on stderr."""

from __future__ import annotations

import sys
import time
from typing import Iterable, Iterator


class SimpleBar:
    """Enough of tqdm's interface for the benchmark: update(), close(), iteration; redraws at most 5x a second."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, desc: str = "",
                 disable: bool = False, stream=None):
        self.iterable = iterable
        self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)
        self.desc, self.disable, self.n = desc, disable, 0
        self.stream = stream or sys.stderr
        self._last = 0.0

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.disable or (not force and now - self._last < 0.2):
            return
        self._last = now
        total = f"/{self.total}" if self.total is not None else ""
        self.stream.write(f"\r{self.desc}: {self.n}{total}")
        self.stream.flush()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._draw(force=self.n == self.total)

    def close(self) -> None:
        if not self.disable:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()


def progress_bar(iterable: Iterable | None = None, total: int | None = None, desc: str = "", disable: bool = False):
    try:
        from tqdm import tqdm
    except ImportError:
        return SimpleBar(iterable, total=total, desc=desc, disable=disable)
    return tqdm(iterable, total=total, desc=desc, disable=disable)
