"""The run's progress bar: tqdm on stderr, with the failure count in the postfix."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class ProgressBar:
    """tqdm redraws in place on a terminal; elsewhere (CI logs) only the final line is written, so
    logs are not flooded with carriage-return frames."""

    def __init__(self, total: int, label: str = "", stream: TextIO | None = None, enabled: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.live = enabled and getattr(self.stream, "isatty", lambda: False)()
        self.failed = 0
        self.done = 0  # tqdm stops counting when disabled
        self._total = max(total, 0)
        self._label = label
        self._t0 = time.perf_counter()
        self._bar = tqdm(
            total=max(total, 0),
            desc=label or None,
            unit="req",
            file=self.stream,
            disable=not self.live,
            mininterval=0.1,
            dynamic_ncols=True,
        )

    def update(self, n: int = 1, failed: bool = False) -> None:
        self.done += n
        if failed:
            self.failed += n
            self._bar.set_postfix(failed=self.failed, refresh=False)
        self._bar.update(n)

    def close(self) -> None:
        self._bar.close()
        if self.enabled and not self.live:
            fail = f" failed={self.failed}" if self.failed else ""
            elapsed = time.perf_counter() - self._t0
            label = f"{self._label}: " if self._label else ""
            self.stream.write(f"{label}{self.done}/{self._total} requests in {elapsed:.1f}s{fail}\n")
            self.stream.flush()
