"""adb transport: the real `adb` client (Debian package `adb`) — shell, push, pull.

Remote relative paths are made absolute under /data/local/tmp, the one place the
`shell` user can write on every Android device.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from edgebench.devices.inventory import Device
from edgebench.devices.transport import CommandResult, PipeSession, Session, Transport, TransportError, stream_process

ANDROID_HOME = "/data/local/tmp"


class AdbTransport(Transport):
    """Talks to one phone by serial; fails at once, with the fix, if adb cannot see it."""

    def __init__(self, device: Device):
        self.device = device
        self.serial = device.transport.serial or ""
        adb = shutil.which("adb")
        if adb is None:
            raise TransportError(
                f"{device.name}: the `adb` client is not installed; `apt-get install adb` (Debian/Ubuntu)"
            )
        self.adb = adb
        state = self._adb(["get-state"], timeout=device.transport.connect_timeout_s, check=False)
        if state.rc != 0 or state.stdout.strip() != "device":
            seen = (state.stderr or state.stdout).strip()
            raise TransportError(
                f"{device.name}: adb device {self.serial!r} is not available ({seen or 'no answer'}). "
                f"Fix: plug the phone in by USB with USB debugging on (Settings > Developer options) and accept "
                f"the prompt, or for wireless debugging `adb connect HOST:PORT`; `adb devices -l` must list "
                f"{self.serial!r} as `device`, and the inventory's `serial:` must match it."
            )

    def _adb(self, args: list[str], timeout: float | None, check: bool = True) -> CommandResult:
        try:
            proc = subprocess.run([self.adb, "-s", self.serial, *args], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise TransportError(f"{self.device.name}: `adb {' '.join(args)}` timed out after {timeout} s") from None
        result = CommandResult(proc.returncode, proc.stdout, proc.stderr)
        if check and result.rc != 0:
            raise TransportError(
                f"{self.device.name}: `adb {' '.join(args)}` failed: {(proc.stderr or proc.stdout).strip()}"
            )
        return result

    def _path(self, remote: str) -> str:
        return remote if remote.startswith("/") else f"{ANDROID_HOME}/{remote}"

    def run(self, argv: list[str], timeout: float | None = 60.0) -> CommandResult:
        return self._adb(["shell", f"cd {ANDROID_HOME} && {shlex.join(argv)}"], timeout, check=False)

    def put(self, local: str | Path, remote: str) -> None:
        self._adb(["push", str(local), self._path(remote)], timeout=None)

    def get(self, remote: str, local: str | Path, offset: int = 0) -> None:
        # adb pull cannot resume: fetch the whole file again (sizes are small: JSON traces).
        self._adb(["pull", self._path(remote), str(local)], timeout=None)

    def interact(self, argv: list[str]) -> Session:
        return PipeSession([self.adb, "-s", self.serial, "shell", f"cd {ANDROID_HOME} && {shlex.join(argv)}"],
                            self.device.name)

    def stream(self, argv: list[str]) -> Iterator[str]:
        return stream_process([self.adb, "-s", self.serial, "shell", f"cd {ANDROID_HOME} && {shlex.join(argv)}"])
