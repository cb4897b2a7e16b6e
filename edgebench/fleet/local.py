"""Running specs on this host, each in its own supervisor process, with progress.

Ctrl-C is this module's to pass on: each supervisor runs in its own process group, so the
terminal's SIGINT reaches only the host command, which passes it on to the running
supervisor (the run ends `interrupted`, result.json written; on a second Ctrl-C at once).
A supervisor that dies without result.json gets one written here.

As root, each run lives in a memory and CPU cgroup of its own (no tighter limit than the host's
RAM and cores), as a lab device's runs do: its device RAM is then the run's, not the whole
host's with everyone else's work in it. Without the rights to make one, the figure is the
host's, labelled host-wide (edgebench.figures.memory).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebench.figures.run import figures_of_run_dir
from edgebench.figures.run_events import StepEnd, event_of
from edgebench.results.heldout import evaluate_saved_weights
from edgebench.runner.spec import RunSpec
from edgebench.telemetry.trace import TraceTail, write_json_atomic
from edgebench.untrusted import BadRecord

if TYPE_CHECKING:
    from edgebench.devices.cgroups import Limits
    from edgebench.devices.profiles import Profile
    from edgebench.methods.budget import Budget


class Interrupts:
    """Catches Ctrl-C/SIGTERM while runs go on in the foreground (use as a context manager).

    `signal` names the first one caught (None: none). While no supervisor runs, a signal
    raises KeyboardInterrupt at once, so a long export step stops too."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.current: subprocess.Popen[bytes] | None = None
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame: object) -> None:
        first = self.signal is None
        if first:
            self.signal = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.current is None or self.current.poll() is not None:
            if first:
                raise KeyboardInterrupt
            return  # already stopping: what is finishing is left to finish
        self.current.send_signal(signum)  # the supervisor stops the run; a second signal: at once

    def __enter__(self) -> Interrupts:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


@contextlib.contextmanager
def shielded(active: bool) -> Iterator[None]:
    """After a Ctrl-C, the finishing work (ingest) is not cut short by another one."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if active else None
    try:
        yield
    finally:
        if active:
            signal.signal(signal.SIGINT, previous)


def host_budget(profile: Profile, workdir: Path) -> Budget:
    """What a run may take on this host now (methods.budget): from what it reports, as a device's
    facts are read at deploy (`workdir`: where the runs go, or its nearest existing folder: nothing
    is made before the preflight passes)."""
    from edgebench.devices.device_scripts import facts
    from edgebench.fleet.plan import device_budget

    existing = next(p for p in (workdir.absolute(), *workdir.absolute().parents) if p.is_dir())
    return device_budget(profile, "this host", "python", facts.main(str(existing)))


LOCAL_GROUP = "edgebench-local"


def run_cgroup(run_id: str) -> Limits | None:
    """A cgroup of the run's own (devices.cgroups.Limits) holding the host's RAM and every core;
    None where this user cannot make one. Its name is the run id and a random part: two runs of
    one id at once (two bench processes, two test workers) never share a group, whose end kills
    whatever is inside."""
    from edgebench.devices.cgroups import CgroupError, Limits, remove_empty_groups
    from edgebench.devices.device_scripts.facts import meminfo

    remove_empty_groups(LOCAL_GROUP)  # what an earlier bench, killed before its cleanup, left
    name = f"{LOCAL_GROUP}/{run_id}-{secrets.token_hex(4)}"
    try:  # the host's RAM as the kernel has it: the group accounts, it does not limit
        return Limits.create(name, meminfo()["MemTotal"], float(os.cpu_count() or 1))
    except (CgroupError, OSError):
        return None


def run_local(spec: RunSpec, run_dir: Path, on_progress: Callable[[int], None] | None = None,
              interrupts: Interrupts | None = None) -> dict[str, Any]:
    """Runs the spec under a fresh supervisor process and returns its figures (made from its
    raw records by edgebench.figures.run, as the store makes them).

    A separate supervisor per spec keeps every run's memory its own. `on_progress` gets
    the number of finished steps (warmup included) as they happen. With `interrupts`, a
    Ctrl-C is passed to the supervisor and the run still ends with its result.json.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "spec.json"
    spec.save(spec_path)
    group = run_cgroup(str(spec.run_id))  # for_device gave every spec one

    def join_group() -> None:  # in the child, before exec: the supervisor and its worker are the group's
        for procs in group.procs_files() if group is not None else []:
            procs.write_text(str(os.getpid()))

    try:
        return _supervise(spec, run_dir, spec_path, join_group, on_progress, interrupts)
    finally:
        if group is not None:
            group.destroy()


def _step_end(record: dict[str, Any], run_dir: Path) -> bool:
    """Whether a trace line is a step's end (checked: figures.run_events); a bad one is not counted
    here, the run's figures name it once the run is over."""
    try:
        return isinstance(event_of(record, str(run_dir / "events.jsonl")), StepEnd)
    except BadRecord:
        return False


def _supervise(spec: RunSpec, run_dir: Path, spec_path: Path, join_group: Callable[[], None],
               on_progress: Callable[[int], None] | None, interrupts: Interrupts | None) -> dict[str, Any]:
    with open(run_dir / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgebench.runner", str(spec_path), "--out", str(run_dir)],
            stdout=subprocess.DEVNULL, stderr=log, process_group=0, preexec_fn=join_group,
            env={**os.environ, "EDGEBENCH_PARENT_PID": str(os.getpid())})
    if interrupts is not None:
        interrupts.current = proc
    events = TraceTail(run_dir / "events.jsonl")
    steps_done = 0
    try:
        while True:
            running = proc.poll() is None  # read once more after the end: the last steps count too
            steps_done += sum(1 for e in events.read() if _step_end(e, run_dir))
            if on_progress is not None:
                on_progress(steps_done)
            if not running:
                break
            time.sleep(0.25)
    finally:
        if interrupts is not None:
            interrupts.current = None
    result_path = run_dir / "result.json"
    evaluate_saved_weights(run_dir)  # an exported program's held-out evaluations, made here
    figures = figures_of_run_dir(run_dir, shared_host=True)
    if figures is not None:
        return figures
    log_text = (run_dir / "supervisor.log").read_text(errors="replace")[-2000:]
    result = {"run_id": spec.run_id, "method": spec.method, "backend": spec.backend, "model": spec.model,
              "status": "interrupted" if interrupts is not None and interrupts.signal else "error",
              "detail": f"supervisor exited {proc.returncode} without result.json: {log_text}"}
    write_json_atomic(result_path, result)
    return result
