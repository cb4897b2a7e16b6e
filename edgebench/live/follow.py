"""Following a run directory while the runner writes it: locally, or on a device over a
transport (`tail -F` on the device). Yields parsed records; knows nothing of rendering.

Trace lines arrive in pieces; only complete lines are parsed, and a line that is not
JSON is counted and skipped, as `read_trace` does for whole files
(both from `edgebench.telemetry.trace`).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edgebench.telemetry.trace import TraceTail, parse_line

if TYPE_CHECKING:
    from edgebench.devices.transport import Transport

TRACE_FILES = ("samples.jsonl", "events.jsonl")


@dataclass
class Update:
    """What arrived since the last poll."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    bad_lines: int = 0
    error: str | None = None  # the follower stopped (connection lost, ...)


class RunSource(Protocol):
    """What the live view follows: a run directory here (LocalRun) or on a device (RemoteRun)."""

    label: str

    @property
    def run_dir(self) -> str | Path: ...

    def poll(self) -> Update: ...

    def sweep_json(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None  # not written yet, or caught between write and rename
    return data if isinstance(data, dict) else None


class LocalRun:
    """A run directory on this machine (also: an SSH terminal on the device itself)."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.label = str(self.run_dir)
        self.tails = {name: TraceTail(self.run_dir / name) for name in TRACE_FILES}
        self.meta: dict[str, Any] | None = None
        self.result: dict[str, Any] | None = None

    def poll(self) -> Update:
        up = Update()
        if self.meta is None:
            self.meta = up.meta = _read_json(self.run_dir / "meta.json")
        for name, tail in self.tails.items():
            before = tail.bad_lines
            (up.samples if name == "samples.jsonl" else up.events).extend(tail.read())
            up.bad_lines += tail.bad_lines - before
        if self.result is None:
            self.result = up.result = _read_json(self.run_dir / "result.json")
        return up

    def sweep_json(self) -> dict[str, Any] | None:
        """The sweep.json of the sweep the run is in (None: a run outside a sweep)."""
        return _read_json(self.run_dir.parent.parent / "sweep.json")

    def close(self) -> None:
        pass


class RemoteRun:
    """A run directory on a device, followed through an `edgebench.devices` transport.

    One `tail -F` streams both trace files (its `==> name <==` headers say which file
    the next lines come from); meta.json and result.json are fetched with `cat` once a
    second until they exist. Both run in threads and hand records to `poll()`.
    """

    def __init__(self, transport: Transport, run_dir: str, json_interval_s: float = 1.0):
        self.transport = transport
        self.run_dir = run_dir.rstrip("/")
        self.label = f"{transport.device.name}:{self.run_dir}"
        self.interval = json_interval_s
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.stop = threading.Event()
        self.stream: Iterator[str] | None = None
        self.threads = [threading.Thread(target=self._tail, daemon=True),
                        threading.Thread(target=self._fetch_json, daemon=True)]
        for t in self.threads:
            t.start()

    def _tail(self) -> None:
        paths = [f"{self.run_dir}/{name}" for name in TRACE_FILES]
        current = None
        try:
            self.stream = stream = self.transport.stream(["tail", "-n", "+1", "-F", *paths])
            for line in stream:
                if self.stop.is_set():
                    break
                if line.startswith("==> ") and line.endswith(" <=="):
                    current = line[4:-4].rsplit("/", 1)[-1]
                    continue
                if not line.strip():
                    continue
                rec = parse_line(line)
                self.queue.put(("bad", 1) if rec is None else
                               ("sample" if current == "samples.jsonl" else "event", rec))
        except Exception as exc:  # the transport's errors name the device and the fix
            if not self.stop.is_set():
                self.queue.put(("error", f"{self.label}: following stopped ({exc})"))

    def _cat(self, name: str) -> dict[str, Any] | None:
        result = self.transport.run(["cat", f"{self.run_dir}/{name}"], timeout=10)
        return parse_line(result.stdout) if result.rc == 0 else None

    def _fetch_json(self) -> None:
        have_meta = False
        while not self.stop.is_set():
            try:
                if not have_meta and (meta := self._cat("meta.json")):
                    self.queue.put(("meta", meta))
                    have_meta = True
                if result := self._cat("result.json"):
                    self.queue.put(("result", result))
                    return
            except Exception as exc:
                self.queue.put(("error", f"{self.label}: cannot read run files ({exc})"))
                return
            self.stop.wait(self.interval)

    def sweep_json(self) -> dict[str, Any] | None:
        """The sweep.json of the sweep the run is in (None: a run outside a sweep); unreadable
        (the connection lost: `poll` says so), it counts as still running."""
        try:
            return self._cat("../../sweep.json")
        except Exception as exc:
            self.queue.put(("error", f"{self.label}: cannot read sweep.json ({exc})"))
            return {"state": "running"}

    def poll(self) -> Update:
        up = Update()
        while True:
            try:
                kind, value = self.queue.get_nowait()
            except queue.Empty:
                return up
            if kind == "sample":
                up.samples.append(value)
            elif kind == "event":
                up.events.append(value)
            elif kind == "bad":
                up.bad_lines += 1
            else:
                setattr(up, kind, value)

    def close(self) -> None:
        self.stop.set()
        if self.stream is not None and hasattr(self.stream, "close"):
            try:
                self.stream.close()
            except Exception:  # a generator running in another thread; the daemon thread ends with us
                pass


class Sweep:
    """A sweep followed from run to run: once the followed run has finished, `find()` names
    the newest run (looked for at most every `interval_s`), and a newer one is opened with `open_run`."""

    def __init__(self, find: Callable[[], str | Path], open_run: Callable[[str], RunSource], current: str | Path,
                 interval_s: float = 1.0):
        self.find, self.open_run, self.current = find, open_run, str(current)
        self.interval_s, self._due_s = interval_s, 0.0

    def due(self, now_s: float) -> bool:
        """Whether `interval_s` has passed since the last look (the caller looks now)."""
        if now_s < self._due_s:
            return False
        self._due_s = now_s + self.interval_s
        return True

    def next_run(self) -> RunSource | None:
        """The newest run's follower when it is not the one followed, else None."""
        try:
            newest = str(self.find()).rstrip("/")
        except FileNotFoundError:
            return None
        if newest == self.current.rstrip("/"):
            return None
        self.current = newest
        return self.open_run(newest)


def find_local_run(root: Path, run_id: str | None) -> Path:
    """The run directory of `run_id` under root (root/ID, root/DEVICE/ID, root/sweeps/S/runs/ID),
    or the most recently started run when no id is given."""
    patterns = ["*/meta.json", "*/*/meta.json", "sweeps/*/runs/*/meta.json", "*/runs/*/meta.json"]
    found = [m.parent for p in patterns for m in root.glob(p)]
    if run_id:
        found = [d for d in found if d.name == run_id]
    if not found:
        what = f"run {run_id!r}" if run_id else "run"
        raise FileNotFoundError(f"{root}: no {what} here (looked for */meta.json, */*/meta.json, sweeps/*/runs/*/); "
                                "pass --dir RUN_DIR or --root")
    return max(found, key=lambda d: (d / "meta.json").stat().st_mtime)


def find_remote_run(transport: Transport, workdir: str, run_id: str | None) -> str:
    """The run directory on the device: `<workdir>/sweeps/*/runs/<run_id>`, or the newest one."""
    script = 'ls -1td -- "$1"/sweeps/*/runs/${2:-*}/ 2>/dev/null | head -n 1'
    result = transport.run(["sh", "-c", script, "sh", workdir, run_id or ""], timeout=20)
    path = result.stdout.strip()
    if not path:
        what = f"run {run_id!r}" if run_id else "run"
        raise FileNotFoundError(f"{transport.device.name}: no {what} under {workdir}/sweeps/*/runs/; "
                                f"deploy one first (`edgebench deploy --device {transport.device.name}`)")
    return path.rstrip("/")
