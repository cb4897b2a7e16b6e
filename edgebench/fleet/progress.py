"""Progress that shows when nobody watches a terminal.

rich's bars draw nothing while their output is piped or logged, so bench, deploy and export
would stay silent for minutes. Off a terminal they print one plain line per stage or step
instead, on stderr, each with the seconds since the command started: `[   12.3 s] sgd: step 2/6`.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLines:
    """Callable with a line of progress; repeats of the last line are dropped."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.start = time.monotonic()
        self.last: str | None = None

    def __call__(self, text: str) -> None:
        if text == self.last:
            return
        self.last = text
        # one write a line: print() writes its end apart, where another thread's line can slip in
        self.stream.write(f"[{time.monotonic() - self.start:7.1f} s] {text}\n")
        self.stream.flush()


def plain_progress(stream: TextIO) -> ProgressLines | None:
    """ProgressLines on stderr when `stream` (where the bars would draw) is not a terminal, else None."""
    return None if stream.isatty() else ProgressLines()
