"""One interface to reach any device: run a command, put and get files, stream lines.

Remote relative paths are relative to the device user's home directory (what SSH and
SFTP do); commands are argv lists, quoted with shlex where a shell is involved.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from edgebench.devices.inventory import Device
from edgebench.errors import EdgebenchError


class TransportError(EdgebenchError, RuntimeError):
    """A device that cannot be reached or used; the message names the device and the fix."""


@dataclass
class CommandResult:
    """Exit status, output and, if the command died of a signal, its name (e.g. "KILL").

    Unpacks as `rc, stdout, stderr`.
    """

    rc: int
    stdout: str
    stderr: str
    exit_signal: str | None = None

    def __iter__(self) -> Iterator[object]:
        return iter((self.rc, self.stdout, self.stderr))


class Session(ABC):
    """A command that answers one line per line sent (for clock probes: ~1 ms a round trip)."""

    @abstractmethod
    def ask(self, line: str, timeout: float = 10.0) -> str:
        """Sends one line and returns the next line of the command's output."""

    @abstractmethod
    def close(self) -> None:
        """Ends the command."""


class PipeSession(Session):
    """A Session over a local subprocess (the local device, or the adb client)."""

    def __init__(self, argv: list[str], name: str):
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def ask(self, line: str, timeout: float = 10.0) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise TransportError(f"{self.name}: the command ended (exit {self.proc.poll()})") from None
        reply = self.proc.stdout.readline()
        if not reply:
            raise TransportError(f"{self.name}: the command ended without answering (exit {self.proc.wait()})")
        return reply.rstrip("\r\n")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Transport(ABC):
    """What deploy, collect and the live view need from a device connection."""

    device: Device

    @abstractmethod
    def run(self, argv: list[str], timeout: float | None = 60.0) -> CommandResult:
        """Runs argv on the device and waits for it (TransportError on timeout)."""

    @abstractmethod
    def put(self, local: str | Path, remote: str) -> None:
        """Copies one local file to a remote path (parent dir must exist)."""

    @abstractmethod
    def get(self, remote: str, local: str | Path, offset: int = 0) -> None:
        """Copies a remote file; offset > 0 appends the bytes from there to the local file."""

    @abstractmethod
    def stream(self, argv: list[str]) -> Iterator[str]:
        """Yields the command's stdout line by line (no newline); closing it stops the command."""

    @abstractmethod
    def interact(self, argv: list[str]) -> Session:
        """Starts argv with a line-by-line conversation on its stdin/stdout."""

    def close(self) -> None:  # noqa: B027 - a transport without a connection has nothing to release
        """Releases the connection."""

    def check(self, argv: list[str], timeout: float | None = 60.0) -> str:
        """run() that raises with the device's stderr unless the command succeeds."""
        result = self.run(argv, timeout)
        if result.rc != 0:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            died = f" (signal {result.exit_signal})" if result.exit_signal else ""
            raise TransportError(
                f"{self.device.name}: `{' '.join(argv)}` failed with exit code {result.rc}{died}: {detail}"
            )
        return result.stdout

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copy_from(src: Path, dst: Path, offset: int) -> None:
    with open(src, "rb") as fin, open(dst, "ab" if offset else "wb") as fout:
        if offset:
            fout.truncate(offset)
            fin.seek(offset)
        shutil.copyfileobj(fin, fout)


class LocalTransport(Transport):
    """This machine, through subprocesses; relative paths are under the home directory."""

    def __init__(self, device: Device):
        self.device = device
        self.home = Path.home()

    def _path(self, remote: str) -> Path:
        return self.home / Path(remote).expanduser()

    def run(self, argv: list[str], timeout: float | None = 60.0) -> CommandResult:
        try:
            proc = subprocess.run(argv, cwd=self.home, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.device.name}: `{' '.join(argv)}` timed out after {timeout} s") from None
        except FileNotFoundError as exc:
            return CommandResult(127, "", str(exc))
        died_of = signal.Signals(-proc.returncode).name.removeprefix("SIG") if proc.returncode < 0 else None
        return CommandResult(proc.returncode, proc.stdout, proc.stderr, died_of)

    def put(self, local: str | Path, remote: str) -> None:
        shutil.copyfile(local, self._path(remote))

    def get(self, remote: str, local: str | Path, offset: int = 0) -> None:
        _copy_from(self._path(remote), Path(local), offset)

    def interact(self, argv: list[str]) -> Session:
        return PipeSession(argv, self.device.name)

    def stream(self, argv: list[str]) -> Iterator[str]:
        return stream_process(argv, cwd=self.home)


def stream_process(argv: list[str], cwd: str | Path | None = None) -> Iterator[str]:
    """Lines of a local process's stdout as they come; the process is killed when the caller stops."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            yield line.rstrip("\r\n")
    finally:
        proc.kill()
        proc.wait()
