"""The supervisor: runs one spec in a fresh worker process, samples it, and always
writes result.json — for an OOM kill, a timeout, a Ctrl-C, a SIGTERM or a full disk as
much as for success.

It records raw facts only (edgebench.figures.readings): how the worker ended (`end`, a
`figures.run_end.RunEnd`), CPU
snapshots before and after, the sampler's health; the host makes the figures from them
(edgebench.figures.run). Its own `status` is the host's mapping of the same facts
(edgebench.figures.status), for the sweep and the progress shown while it runs. It never
imports torch, so its own footprint stays small on a 512 MB device. The worker dies with its
supervisor (PR_SET_PDEATHSIG), so no run trains unsupervised.

A spec with a `command` (`edgebench measure`) runs that command in the worker's place, the same
way: sampled, its end recorded (its exit codes its own: RunEnd.exit_codes), its step marks
(edgebench.measure) appended to events.jsonl, which EVENTS_ENV names to it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

from edgebench.figures.run_end import RunEnd
from edgebench.figures.run_events import Predicted, events_of
from edgebench.figures.run_meta import ClockPair, OomKillsAtStart, RunClock, RunMeta
from edgebench.figures.run_samples import sample_of
from edgebench.figures.status import run_status
from edgebench.measure import EVENTS_ENV
from edgebench.runner import native, worker
from edgebench.runner.facts import device_facts, library_versions
from edgebench.runner.oom_score import volunteer_for_oom_kill
from edgebench.runner.spec import RunSpec
from edgebench.telemetry.clock import clock_pair
from edgebench.telemetry.contention import cpu_snapshot
from edgebench.telemetry.memory import oom_kill_count
from edgebench.telemetry.trace import parse_line, read_trace, write_json_atomic
from edgebench.untrusted import BadRecord

POLL_S = 0.02
GRACE_S = 5.0  # after a Ctrl-C/SIGTERM the worker gets this long to stop by itself, then SIGKILL
RESERVE_BYTES = 256 * 1024  # kept free in the run directory so result.json fits on a full disk
RESERVE_FILE = ".result-reserve"
LOG_TAIL_BYTES = 4096  # of worker.log, kept in `end` for a worker that never wrote an event


class Reserve:
    """A file of real bytes holding room on the disk until released (tmpfs and ext4 both
    allocate written zeros), so the last record can be written when the disk fills up."""

    def __init__(self, path: Path, size: int = RESERVE_BYTES):
        self.path = path
        try:
            with open(path, "wb") as fh:
                fh.write(b"\0" * size)
                fh.flush()
                os.fsync(fh.fileno())
            self.held = True
        except OSError:
            path.unlink(missing_ok=True)
            self.held = False

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
        self.held = False


def disk_full(path: Path, exc: BaseException | None = None) -> bool:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    try:
        return shutil.disk_usage(path).free < RESERVE_BYTES // 2
    except OSError:
        return False


def kernel_oom_record(pid: int, since_mono_ns: int, kmsg: str = "/dev/kmsg") -> dict[str, str | None] | None:
    """The kernel's log of an OOM kill of `pid` since the given monotonic time: `line`, the last
    line naming the pid, and `constraint`, what the killer acted for (CONSTRAINT_MEMCG: a cgroup's
    limit; CONSTRAINT_NONE: the whole host ran out), which tells the run's OOM from the host's
    (edgebench.figures.status.host_oom). None where there is no such record, or the log is not
    readable: then only the cgroup can tell. `kmsg`: /dev/kmsg (a record per read) or a file of its lines."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    line = constraint = None
    rest = ""
    try:
        while True:
            try:
                chunk = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:
                break
            except OSError as exc:  # EPIPE: the ring buffer overwrote what we were about to read
                if exc.errno == errno.EPIPE:
                    continue
                break
            if not chunk:
                break
            *records, rest = (rest + chunk).split("\n")
            for record in records:
                header, _, text = record.partition(";")
                fields = header.split(",")
                try:
                    if int(fields[2]) * 1000 < since_mono_ns - 1_000_000_000:
                        continue
                except (IndexError, ValueError):
                    continue  # not a record's first line (a continuation line starts with a space)
                if f"Killed process {pid} " in text:
                    line = text.strip()
                elif text.startswith("oom-kill:") and f",pid={pid}," in text:
                    constraint = text.partition("constraint=")[2].partition(",")[0] or None
                    line = line or text.strip()
    finally:
        os.close(fd)
    return None if line is None else {"line": line, "constraint": constraint}


def _int(value: Any, otherwise: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else otherwise


def memory_low_point(samples: Path) -> dict[str, int | None]:
    """The lowest MemAvailable the run's samples read, the cgroup's usage then and its limit: what
    tells a host that ran out of memory from a run that reached its own limit, where the kernel's
    log cannot (edgebench.figures.status.host_oom). Read line by line: a long run's file is big."""
    low: int | None = None
    used: int | None = None
    usage: int | None = None
    limit: int | None = None
    try:
        with open(samples, "rb") as fh:
            for n, raw in enumerate(fh, start=1):
                rec = parse_line(raw) or {}
                try:
                    sample_of(rec, f"{samples} line {n}")
                except BadRecord:  # not what its sampler writes: the host refuses the run (figures.run_samples)
                    continue
                usage = _int(rec.get("cgroup_usage_bytes"), usage)
                limit = _int(rec.get("cgroup_limit_bytes"), limit)
                available = _int(rec.get("mem_available_bytes"), None)
                if available is not None and (low is None or available < low):
                    low, used = available, usage
    except OSError:
        pass
    return {"mem_available_low_bytes": low, "cgroup_usage_at_low_bytes": used, "cgroup_limit_bytes": limit}


class Supervisor:
    def __init__(self, spec: RunSpec, out: str | Path, root: str = "/"):
        self.spec = spec
        self.out = Path(out)
        self.root = root
        self.interrupted: str | None = None  # the signal that stopped the run, named
        self.child: subprocess.Popen[bytes] | None = None
        self._kill_at: float | None = None
        self._started_ns = 0  # the worker's start, monotonic: kernel OOM records before it are not its
        self._previous: dict[int, Any] = {}
        self._facts: RunMeta | None = None  # meta.json's facts of the run, read as it starts
        self._readings: dict[str, Any] | None = None  # the sampler's, once it started
        self.native = spec.backend == "executorch" and spec.runtime == "native"
        # which worker trains: recorded in meta.json and shown by report
        self.runtime: Literal["native", "python"] | None = \
            ("native" if self.native else "python") if spec.backend == "executorch" else None
        self.start_problem: str | None = None  # why the worker could not be started at all
        # the kernel's OOM kill count where it can take the worker: a run whose sweep process dies
        # with its worker (devices/device_scripts/sweeps.py) is still told `oom` from it
        counted = oom_kill_count(os.getpid(), root)
        self._oom_kills_at_start = OomKillsAtStart(str(counted[0]), counted[1]) if counted else None

    def _worker_command(self, spec_path: Path) -> list[str]:
        if self.spec.command:  # `edgebench measure`: the user's command is the worker
            return list(self.spec.command)
        if self.native:
            return native.command(self.spec, self.out)
        return [sys.executable, "-m", "edgebench.runner.worker", str(spec_path), "--out", str(self.out)]

    def _write_meta(self, clock_start: dict[str, int], clock_end: dict[str, int] | None,
                    predicted: Any) -> None:
        """meta.json (a `figures.run_meta.RunMeta`) at start, again once the sampler says where its
        readings come from, and at the end with the end clock and the prediction."""
        if self._facts is None:  # read once: the device and its libraries do not change mid-run
            worker_dir = self.spec.native_worker
            self._facts = RunMeta(
                run_id=self.spec.run_id, supervisor="python", runtime=self.runtime, spec=self.spec.to_dict(),
                device=device_facts(), versions=library_versions(),
                native_worker=(native.bundle_facts(worker_dir) if worker_dir else {}) if self.native else None,
                ran=native.files_that_run(self.spec) if self.native else None,
                oom_kills_at_start=self._oom_kills_at_start)
        meta = dataclasses.replace(
            self._facts, readings=self._readings, predicted=predicted,
            clock=RunClock(ClockPair(**clock_start), None if clock_end is None else ClockPair(**clock_end)))
        write_json_atomic(self.out / "meta.json", meta.to_json())

    def _on_signal(self, signum: int, frame: object) -> None:
        """Ctrl-C or SIGTERM: the worker gets the same signal (so its `interrupted` event and
        result.json name the same one) and is killed after GRACE_S; a second signal kills it
        at once. The sweep's own handler is called too, so it starts no further run."""
        name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
        # returncode is set only once _wait has reaped the worker (poll() here could reap it first)
        child_alive = self.child is not None and self.child.returncode is None
        if self.child is not None and not child_alive:
            pass  # the worker has ended: its result is being written as it ended
        elif self.interrupted is None:
            self.interrupted = name
            self._kill_at = time.monotonic() + GRACE_S
            if child_alive:
                self._kill(signum)
        else:
            self._kill_at = time.monotonic()
        previous = self._previous.get(signum)
        if callable(previous) and previous is not signal.default_int_handler:  # that one would raise
            previous(signum, frame)

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        reserve = Reserve(self.out / RESERVE_FILE)
        clock_start = clock_pair()
        self._cpu_start = cpu_snapshot(self.root)
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._on_signal)
        sampler_summary: dict[str, Any] = {}
        exit_code = exit_signal = None
        maxrss, timed_out, failure = 0, False, None
        try:  # the handlers stay until result.json is written: a second Ctrl-C cannot cut it short
            try:
                spec_path = self.out / "spec.json"
                self.spec.save(spec_path)
                self._write_meta(clock_start, None, None)
                if self.native:
                    self.start_problem = native.start_problem(self.spec)
                if self.interrupted is None and self.start_problem is None:
                    with open(self.out / "worker.log", "ab") as log:
                        try:
                            self.child = subprocess.Popen(
                                self._worker_command(spec_path), stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, worker.SUPERVISOR_PID_ENV: str(os.getpid()),
                                     **(native.exec_prefix() if self.native else {}),
                                     **({EVENTS_ENV: str((self.out / "events.jsonl").absolute())}
                                        if self.spec.command else {})},
                                preexec_fn=_as_measured_command if self.spec.command else None,
                            )
                        except OSError as exc:  # ENOEXEC, EACCES, ENOENT: the worker cannot run here
                            if disk_full(self.out, exc):
                                raise
                            self.start_problem = (f"the command could not be started: {exc}" if self.spec.command
                                                  else f"the worker could not be started: {exc}; deploy again")
                if self.child is not None:
                    self._started_ns = time.monotonic_ns()
                    sampler = self._start_sampler()
                    if sampler is None:  # the run is not measured: the worker goes, the reason is recorded
                        self._kill(signal.SIGKILL)
                    else:  # where each reading comes from, written before the run goes on
                        self._readings = sampler.readings()
                        self._write_meta(clock_start, None, None)
                    exit_code, exit_signal, maxrss, timed_out = self._wait()
                    if sampler is not None:
                        sampler_summary = sampler.stop()
            except OSError as exc:  # the disk filled up before or around the worker
                failure = exc
                if self.child is not None and self.child.returncode is None:
                    self._kill(signal.SIGKILL)
                    exit_code, exit_signal, maxrss, timed_out = self._wait()
            finally:
                reserve.release()
            return self._finish(clock_start, exit_code, exit_signal, maxrss, timed_out, sampler_summary, failure)
        finally:
            for number, previous in self._previous.items():
                signal.signal(number, previous)

    def _start_sampler(self) -> Any:
        """The worker's sampler, started; None when it cannot start for any reason but a full
        disk (an OSError, the caller's): `start_problem` then says why, and the run ends as an
        error with that reason in result.json."""
        from edgebench.telemetry.sampler import Sampler

        assert self.child is not None, "the sampler follows a started worker"
        try:
            sampler = Sampler(self.out / "samples.jsonl", self.child.pid, rate_hz=self.spec.sample_hz,
                              root=self.root, sensors=self.spec.sensors)
            return sampler.start()
        except OSError:
            raise
        except Exception as exc:
            self.start_problem = f"sampling could not start: {type(exc).__name__}: {exc}"
            return None

    def _kill(self, sig: int) -> None:
        """Signals the worker by pid: until _wait reaps it, the pid is still ours (a zombie at
        worst). Popen.send_signal would poll, and could reap it before wait4 reads its usage."""
        assert self.child is not None, "no worker started"
        try:  # a measured command leads a process group of its own: the signal reaches its whole tree
            if self.spec.command:
                os.killpg(self.child.pid, sig)
            else:
                os.kill(self.child.pid, sig)
        except ProcessLookupError:
            pass

    def _wait(self) -> tuple[int | None, int | None, int, bool]:
        """Waits for the worker (wait4 gives its ru_maxrss); kills it past timeout_s, or
        past the grace period after an interrupt."""
        assert self.child is not None, "no worker started"
        deadline = None if self.spec.timeout_s is None else time.monotonic() + self.spec.timeout_s
        timed_out = False
        while True:
            pid, status, usage = os.wait4(self.child.pid, os.WNOHANG)
            if pid:
                break
            now = time.monotonic()
            if deadline is not None and now > deadline and not timed_out and self.interrupted is None:
                timed_out = True
                self._kill(signal.SIGKILL)
            if self._kill_at is not None and now >= self._kill_at:
                self._kill(signal.SIGKILL)
                self._kill_at = None
            time.sleep(POLL_S)
        self.child.returncode = os.waitstatus_to_exitcode(status)
        exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        exit_signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        return exit_code, exit_signal, usage.ru_maxrss * 1024, timed_out

    def _log_tail(self) -> str:
        try:
            with open(self.out / "worker.log", "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def _finish(
        self,
        clock_start: dict[str, int],
        exit_code: int | None,
        exit_signal: int | None,
        maxrss: int,
        timed_out: bool,
        sampler: dict[str, Any],
        failure: OSError | None = None,
    ) -> dict[str, Any]:
        trace = read_trace(self.out / "events.jsonl")
        try:
            events = events_of(trace.records, str(self.out / "events.jsonl"), trace.line_numbers)
            foreign = None
        except BadRecord as exc:  # not what a worker writes: the result says so (the host refuses the trace)
            events, foreign = [], str(exc)
        predicted = next((e.memory for e in events if isinstance(e, Predicted)), None)
        try:
            self._write_meta(clock_start, clock_pair(), predicted)
        except OSError as exc:
            failure = failure or exc
        # read after every kill: a host-wide OOM raises the cgroup's counter too, only the kernel tells them apart
        kernel_oom = None
        if exit_signal is not None and self.child is not None:
            kernel_oom = kernel_oom_record(self.child.pid, self._started_ns)
        low = memory_low_point(self.out / "samples.jsonl")
        end = RunEnd(
            exit_code=exit_code,
            exit_signal=exit_signal,
            timed_out=timed_out,
            stopped_by=self.interrupted,
            oom_kills_start=_int(sampler.get("oom_kills_start"), None),
            oom_kills_end=_int(sampler.get("oom_kills_end"), None),
            kernel_oom=(kernel_oom or {}).get("line"),
            kernel_oom_constraint=(kernel_oom or {}).get("constraint"),
            mem_available_low_bytes=low["mem_available_low_bytes"],
            cgroup_usage_at_low_bytes=low["cgroup_usage_at_low_bytes"],
            cgroup_limit_bytes=low["cgroup_limit_bytes"],
            start_problem=self.start_problem,
            write_failure=str(failure) if failure is not None else None,
            disk_full=disk_full(self.out, failure),
            worker_peak_bytes=maxrss or None,
            worker_peak_from="ru_maxrss" if maxrss else None,
            worker_log_tail=None if trace.records and not self.spec.command else self._log_tail(),
            exit_codes="command" if self.spec.command else "edgebench",
        )
        status, detail = ("error", foreign) if foreign else run_status(end, events)
        result = {
            "status": status,
            "detail": detail,
            "run_id": self.spec.run_id,
            "model": self.spec.checkpoint or self.spec.model,
            "method": self.spec.method,
            "backend": self.spec.backend,
            "runtime": self.runtime,
            "batch_size": self.spec.batch_size,
            "recorded_by": "python",
            "end": end.to_json(),
            "cpu_start": self._cpu_start,
            "cpu_end": cpu_snapshot(self.root),
            "sampler": sampler,
        }
        write_json_atomic(self.out / "result.json", result)
        return result


def _as_measured_command() -> None:
    """In a measured command's process, before its exec: what the Python worker does for itself
    (runner/worker.py): it dies with the supervisor (SIGKILL) and is the OOM killer's first choice;
    and it leads a process group, so a stop or a kill reaches the processes it starts as well."""
    os.setpgid(0, 0)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(worker.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the supervisor's own kill on the way out is all there is
    volunteer_for_oom_kill()


def run_spec(spec: RunSpec, out: str | Path, root: str = "/") -> dict[str, Any]:
    """Runs one spec to completion (whatever happens) and returns its result.json."""
    return Supervisor(spec, out, root=root).run()
