"""A tiny progress bar on stderr (no tqdm dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    """Redrawn in place at most ~10 times a second; prints a final line on close.

    When the stream is not a terminal (CI logs), only the final line is written, so logs are
    not flooded with carriage-return frames."""

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, enabled: bool = True):
        self.total = max(total, 0)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.live = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.done = 0
        self.failed = 0
        self.t0 = time.perf_counter()
        self._last_draw = 0.0

    def update(self, n: int = 1, failed: bool = False) -> None:
        self.done += n
        if failed:
            self.failed += n
        now = time.perf_counter()
        if self.live and (now - self._last_draw >= 0.1 or self.done >= self.total):
            self._last_draw = now
            self.stream.write("\r" + self.render(now))
            self.stream.flush()

    def render(self, now: float | None = None) -> str:
        now = time.perf_counter() if now is None else now
        elapsed = now - self.t0
        frac = self.done / self.total if self.total else 1.0
        width = 30
        filled = int(width * min(frac, 1.0))
        bar = "#" * filled + "-" * (width - filled)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        fail = f" failed={self.failed}" if self.failed else ""
        label = f"{self.label} " if self.label else ""
        count = f"{self.done}/{self.total} {100 * frac:5.1f}%"
        return f"{label}[{bar}] {count} {elapsed:6.1f}s {rate:6.2f} req/s{fail}"

    def close(self) -> None:
        if not self.enabled:
            return
        self.stream.write(("\r" if self.live else "") + self.render() + "\n")
        self.stream.flush()
