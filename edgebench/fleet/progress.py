"""Progress that shows when nobody watches a terminal.

rich's bars draw nothing while their output is piped or logged, so bench, deploy and export
would stay silent for minutes. Off a terminal they print one plain line per stage or step
instead, on stderr, each with the seconds since the command started: `[   12.3 s] sgd: step 2/6`.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

    from edgebench.runner.spec import RunSpec


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


class RunBars:
    """bench's display of its runs: a rich bar each on a terminal, one plain line per stage and
    step when piped, nothing with --json (stdout is the JSON). A context manager, as rich's is."""

    def __init__(self, quiet: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.plain = None if quiet else plain_progress(sys.stdout)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), disable=quiet or self.plain is not None, transient=False)

    def __enter__(self) -> RunBars:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def add(self, spec: RunSpec, name: str) -> RunBar:
        """The bar of one run, as the sweep `name`s it (`run 2 of 4: sgd, lr 0.01`; a re-run of a
        disturbed run says so); its total is the steps, warmup included (unknown for a --duration run)."""
        label = f"{name} ({spec.backend})" + (" re-run: disturbed" if spec.extra.get("rerun_of") else "")
        total = None if spec.duration_s else spec.warmup_steps + spec.steps
        return RunBar(self, self.progress.add_task(label, total=total), label, total)


class RunBar:
    """One run's bar: its stage (exporting, loading, its status) and its steps."""

    def __init__(self, bars: RunBars, task: TaskID, label: str, total: int | None) -> None:
        self.bars, self.task, self.label, self.total = bars, task, label, total

    def stage(self, text: str) -> None:
        self.bars.progress.update(self.task, description=f"{self.label}: {text}")
        if self.bars.plain:
            self.bars.plain(f"{self.label}: {text}")

    def step(self, done: int) -> None:
        self.bars.progress.update(self.task, completed=done)
        if self.bars.plain:
            self.bars.plain(f"{self.label}: step {done}/{self.total or '?'}" if done else f"{self.label}: loading")

    def ended(self, result: dict[str, Any]) -> None:
        """The run's status; a run stopped early keeps its bar where it stopped."""
        if result["status"] == "ok":
            self.bars.progress.update(self.task, completed=self.total or result.get("steps_done") or 0)
        self.stage(result["status"])


class StageBar:
    """export's display: one bar through its known stages on a terminal (stderr), one plain line
    per stage when piped, nothing with --json. A context manager, as rich's is."""

    def __init__(self, what: str, where: str, stages: list[str], quiet: bool, console: Console | None) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.what, self.title, self.stages = what, f"{what} for {where}", stages
        self.plain = None if quiet else plain_progress(sys.stderr)
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), console=console,
                                 disable=quiet or self.plain is not None, transient=False)

    def __enter__(self) -> StageBar:
        self.progress.__enter__()
        self.task = self.progress.add_task(self.title, total=len(self.stages))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def stage(self, stage: str) -> None:
        done = self.stages.index(stage) if stage in self.stages else 0
        self.progress.update(self.task, completed=done, description=f"{self.what}: {stage}")
        if self.plain:
            self.plain(f"{self.title}: {stage} ({done + 1}/{len(self.stages)})")

    def ended(self, how: str) -> None:
        """Every stage done (`how`: done, cached)."""
        self.progress.update(self.task, completed=len(self.stages), description=f"{self.what}: {how}")
        if self.plain:
            self.plain(f"{self.title}: {how}")
