"""SSH transport: asyncssh underneath, a synchronous facade on top.

One connection per device, host keys verified against known_hosts (never skipped),
key authentication, timeouts, argv quoted with shlex. All connections share one event
loop running in a daemon thread, so several devices can be driven from several threads.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from edgebench.devices.background_loop import background_loop
from edgebench.devices.inventory import Device
from edgebench.devices.transport import CommandResult, Session, Transport, TransportError

T = TypeVar("T")


def _event_loop() -> asyncio.AbstractEventLoop:
    return background_loop("ssh")


async def _await(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _call(awaitable: Awaitable[T], timeout: float | None = None) -> T:
    """Runs an awaitable on the shared loop and waits for its result in this thread."""
    future: Future[T] = asyncio.run_coroutine_threadsafe(_await(awaitable), _event_loop())
    return future.result(timeout)


def _known_hosts_path(device: Device) -> str:
    return os.path.expanduser(device.transport.known_hosts or "~/.ssh/known_hosts")


def host_key_error(device: Device) -> TransportError:
    """Explains a refused host key: changed (possible interception) or never recorded."""
    t = device.transport
    path = _known_hosts_path(device)
    host_spec = t.host if t.port == 22 else f"[{t.host}]:{t.port}"
    listed = False
    if os.path.exists(path):
        listed = bool(asyncssh.read_known_hosts(path).match(t.host or "", "", t.port)[0])
    if listed:
        return TransportError(
            f"{device.name} ({t.host}:{t.port}): HOST KEY CHANGED — the key the device offers does not match "
            f"the one recorded in {path}. Connection refused: someone may be intercepting it. If the device was "
            f"reinstalled or its key regenerated, check its new fingerprint on the device, then "
            f"`ssh-keygen -R '{host_spec}' -f {path}` and add the new key."
        )
    return TransportError(
        f"{device.name} ({t.host}:{t.port}): host key not in {path}, so it cannot be verified. Check the "
        f"fingerprint on the device, then `ssh-keyscan -p {t.port} {t.host} >> {path}`."
    )


class _SSHSession(Session):
    def __init__(self, transport: SSHTransport, command: str):
        self.name = transport.device.name
        self.process = _call(transport._conn.create_process(command))

    async def _ask(self, line: str) -> str:
        self.process.stdin.write(line + "\n")
        await self.process.stdin.drain()
        return str(await self.process.stdout.readline())

    def ask(self, line: str, timeout: float = 10.0) -> str:
        try:
            reply = _call(self._ask(line), timeout)
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            raise TransportError(f"{self.name}: no answer ({exc or type(exc).__name__})") from None
        if not reply:
            raise TransportError(f"{self.name}: the command ended without answering")
        return reply.rstrip("\n")

    def close(self) -> None:
        self.process.close()


class SSHTransport(Transport):
    """One asyncssh connection (and one SFTP session) to one device."""

    def __init__(self, device: Device):
        self.device = device
        self._sftp: asyncssh.SFTPClient | None = None
        self._conn = _call(self._connect())

    async def _connect(self) -> asyncssh.SSHClientConnection:
        t = self.device.transport
        known_hosts = _known_hosts_path(self.device)
        if not os.path.exists(known_hosts):
            raise host_key_error(self.device)
        # Keepalives notice a dead link within ~45 s instead of hanging a transfer forever.
        options: dict[str, Any] = {"known_hosts": known_hosts, "username": t.user,
                                   "keepalive_interval": 15, "keepalive_count_max": 3}
        if t.key:
            key = os.path.expanduser(t.key)
            if not os.path.exists(key):
                raise TransportError(f"{self.device.name}: key file {key} does not exist; fix `key:` in the inventory")
            options["client_keys"] = [key]
        try:
            # With a key file: that key only (no agent). Without: asyncssh's defaults (agent, ~/.ssh keys).
            return await asyncio.wait_for(
                asyncssh.connect(t.host, t.port, agent_path=None if t.key else (), **options),
                timeout=t.connect_timeout_s,
            )
        except asyncssh.HostKeyNotVerifiable:
            raise host_key_error(self.device) from None
        except asyncssh.PermissionDenied:
            raise TransportError(
                f"{self.device.name} ({self.device.address}): the device refused key authentication; "
                f"check `user:` and `key:` in the inventory and the device's authorized_keys"
            ) from None
        except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
            reason = str(exc) or type(exc).__name__
            raise TransportError(
                f"{self.device.name} ({self.device.address}): unreachable ({reason}); check that it is on and "
                f"sshd runs, and the host/port in the inventory (`edgebench devices` shows them)"
            ) from None

    def run(self, argv: list[str], timeout: float | None = 60.0) -> CommandResult:
        command = shlex.join(argv)
        try:
            proc = _call(self._conn.run(command, check=False, timeout=timeout))
        except asyncssh.TimeoutError:
            raise TransportError(f"{self.device.name}: `{command}` timed out after {timeout} s") from None
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.device.name}: connection lost during `{command}` ({exc})") from None
        signal = proc.exit_signal[0] if proc.exit_signal else None
        rc = proc.exit_status if proc.exit_status is not None else -1
        return CommandResult(rc, str(proc.stdout or ""), str(proc.stderr or ""), signal)

    async def _sftp_client(self) -> asyncssh.SFTPClient:
        if self._sftp is None:
            self._sftp = await self._conn.start_sftp_client()
        return self._sftp

    async def _put(self, local: str, remote: str) -> None:
        await (await self._sftp_client()).put(local, remote)

    async def _get(self, remote: str, local: str, offset: int) -> None:
        sftp = await self._sftp_client()
        async with sftp.open(remote, "rb") as fin:
            await fin.seek(offset)
            with open(local, "ab" if offset else "wb") as fout:
                fout.truncate(offset)
                while chunk := await fin.read(1 << 20):
                    fout.write(chunk)  # type: ignore[arg-type]  # asyncssh's read() -> unbound AnyStr; "rb": bytes

    def put(self, local: str | Path, remote: str) -> None:
        try:
            _call(self._put(str(local), remote))
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.device.name}: upload of {local} to {remote} failed ({exc})") from None

    def get(self, remote: str, local: str | Path, offset: int = 0) -> None:
        try:
            _call(self._get(remote, str(local), offset))
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"{self.device.name}: download of {remote} failed ({exc})") from None

    def interact(self, argv: list[str]) -> Session:
        return _SSHSession(self, shlex.join(argv))

    def stream(self, argv: list[str]) -> Iterator[str]:
        process = _call(self._conn.create_process(shlex.join(argv)))
        try:
            while line := _call(process.stdout.readline()):
                yield str(line).rstrip("\n")
        finally:
            process.close()

    def close(self) -> None:
        async def _close() -> None:
            if self._sftp is not None:
                self._sftp.exit()
            self._conn.close()
            await self._conn.wait_closed()

        try:
            _call(_close(), timeout=5)
        except Exception:  # closing a connection that already died is fine
            pass
