"""The emulated device lab: one real sshd per device, inside the profile's memory and CPU limits.

Each device gets its own sshd on a loopback port, its own host key and known_hosts entry
(host-key checking stays on), key-only login, and cgroups enforcing the profile's
`emulation` limits; every SSH session inherits them. Devices are registered in the
inventory as `lab-<alias>`, so deploy and collect treat them like hardware.
`up` restarts a device whose sshd died inside its existing cgroups, so a sweep still
running there carries on; `down` kills everything inside the cgroups, removes them, the
keys and the entries.
`arch="arm64"` devices run the on-device part on arm64 wheels under qemu user-mode emulation
(devices/arm64.py: the emulation root, built once into a cache); their sshd stays the host's.
State lives in `$EDGEBENCH_LAB_DIR` or ~/.local/state/edgebench/lab.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgebench.devices import arm64, inventory
from edgebench.devices.cgroups import Limits
from edgebench.devices.inventory import edited_inventory, read_inventory
from edgebench.devices.profiles import load_profile
from edgebench.errors import EdgebenchError
from edgebench.methods.budget import Budget, mib

DEFAULT_PROFILES = ("raspberry-pi-4-4gb", "raspberry-pi-zero-2w")
DEFAULT_ARM64_PROFILES = ("raspberry-pi-4-4gb",)  # emulated torch alone takes ~400 MB: not a 512 MiB Zero
ARCHES = {"host": None, "arm64": "aarch64", "aarch64": "aarch64"}
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd")
MIN_RUN_BYTES = 16 * 2**20  # a lab device leaving a run less than this is refused


class LabError(EdgebenchError, RuntimeError):
    """The lab cannot do what was asked; the message says what to do."""


def lab_dir() -> Path:
    return Path(os.environ.get("EDGEBENCH_LAB_DIR") or "~/.local/state/edgebench/lab").expanduser().resolve()


def _state_file(root: Path) -> Path:
    return root / "lab.json"


def read_state(root: Path | None = None) -> dict[str, dict[str, Any]]:
    path = _state_file(root or lab_dir())
    return json.loads(path.read_text()) if path.exists() else {}


def _write_state(root: Path, state: dict[str, dict[str, Any]]) -> None:
    path = _state_file(root)
    if not state:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, path)


@dataclass
class LabDevice:
    """What to start: a profile, optionally under another name or other limits."""

    profile: str
    name: str | None = None
    memory_bytes: int | None = None
    cpus: float | None = None
    arch: str | None = None  # None: this host's python; "arm64": arm64 wheels under emulation
    no_python: bool = False  # a device with no Python: its sessions find only NO_PYTHON_TOOLS

    def device_name(self) -> str:
        emulated = "-arm64" if ARCHES.get(self.arch or "host") else ""
        return self.name or f"lab-{load_profile(self.profile).alias}{emulated}{'-nopy' if self.no_python else ''}"


def _sshd() -> str:
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    raise LabError("sshd is not installed; `apt-get install -y openssh-server` (Debian/Ubuntu)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _keygen(path: Path, comment: str) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)


# What a phone's toybox (and a bare board's busybox) gives a shell: the only commands a lab
# device without Python has on its PATH, so anything of edgebench that still needed Python
# there would fail.
NO_PYTHON_TOOLS = (
    "sh",
    "cat",
    "cp",
    "cut",
    "date",
    "df",
    "env",
    "find",
    "grep",
    "gzip",
    "head",
    "id",
    "kill",
    "ln",
    "ls",
    "mkdir",
    "mv",
    "nohup",
    "od",
    "printf",
    "rm",
    "rmdir",
    "sed",
    "setsid",
    "sha256sum",
    "sleep",
    "sort",
    "stat",
    "tail",
    "tar",
    "test",
    "tr",
    "uname",
    "wc",
)


SFTP_SERVERS = ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server", "/usr/libexec/sftp-server")


def _no_python_login(home: Path) -> Path:
    """home/login.sh, the device's forced command: every session (whatever the account's shell
    and its rc files add to PATH) runs with home/bin as its whole PATH, links to this host's
    copies of NO_PYTHON_TOOLS and nothing else; file transfers go to the sftp server."""
    tools = home / "bin"
    shutil.rmtree(tools, ignore_errors=True)
    tools.mkdir()
    for name in NO_PYTHON_TOOLS:
        found = shutil.which(name)
        if found is None:
            raise LabError(f"{name} is not installed on this host; a lab device without Python needs it")
        (tools / name).symlink_to(found)
    sftp = next((p for p in SFTP_SERVERS if os.access(p, os.X_OK)), None)
    if sftp is None:
        raise LabError("no sftp-server found (openssh-server ships it); `apt-get install -y openssh-server`")
    login = home / "login.sh"
    login.write_text(f"""#!/bin/sh
# edgebench lab device without Python: written by `edgebench lab up --no-python`
export PATH={tools}
case "${{SSH_ORIGINAL_COMMAND-}}" in internal-sftp|*sftp-server) exec {sftp} ;; esac
[ -n "${{SSH_ORIGINAL_COMMAND+set}}" ] || exec sh
exec sh -c "$SSH_ORIGINAL_COMMAND"
""")
    login.chmod(0o755)
    return login


def _sshd_config(home: Path, port: int, user: str, login: Path | None = None) -> str:
    forced = f"ForceCommand {login}\n" if login else ""
    return f"""# edgebench lab device: written by `edgebench lab up`
{forced}
Port {port}
ListenAddress 127.0.0.1
HostKey {home}/ssh_host_ed25519_key
PidFile {home}/sshd.pid
AuthorizedKeysFile {home}/authorized_keys
AllowUsers {user}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxStartups 100:30:200
MaxSessions 100
Subsystem sftp internal-sftp
"""


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LabError(f"sshd exited with code {proc.returncode}: {log.read_text().strip()[-1500:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise LabError(f"sshd did not listen on 127.0.0.1:{port} within {timeout_s} s; see {log}")


def _cgroup_name(root: Path, name: str) -> str:
    return f"edgebench-lab-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}/{name}"


# The shell joins the cgroups named by its arguments, then becomes $COMMAND (shell-quoted words).
JOIN = 'for f in "$@"; do echo $$ > "$f" || exit 97; done; eval "exec $COMMAND"'
SHM = Path("/dev/shm")


def lab_budget(spec: LabDevice) -> Budget:
    """What a run may take on the board this lab device emulates (methods.budget): its memory
    less the profile's idle OS footprint (held resident in the device), the sweep's supervisor
    and the margin. A memory that leaves no room is refused, naming the smallest that would."""
    profile = load_profile(spec.profile)
    memory = int(spec.memory_bytes or profile.emulation.memory_bytes)
    held_to = profile.budget(spec.device_name(), memory, "shell" if spec.no_python else "python")
    if held_to.bytes < MIN_RUN_BYTES:
        need = held_to.os_bytes + held_to.supervisor_bytes + held_to.margin_bytes + MIN_RUN_BYTES
        raise LabError(f"--memory {mib(memory)}: leaves a run no room on a {profile.id} board: {held_to.text()}; give "
                       f"--memory of at least {math.ceil(need / 2**20)}MiB")
    return held_to


def _os_memory_file(root: Path, name: str) -> Path:
    """Where a device's stand-in for its board's OS lives: a tmpfs file of the lab's."""
    return SHM / f"edgebench-lab-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}-{name}-os"


def _hold_os_memory(limits: Limits, path: Path, nbytes: int) -> None:
    """Holds the board's OS at idle inside the device: a tmpfs file of `nbytes` written from inside
    its cgroups, whose pages the kernel charges to them and cannot reclaim without swap (a
    restarted device keeps the one it has)."""
    if path.is_file() and path.stat().st_size == nbytes:
        return
    if not SHM.is_dir():
        raise LabError(f"{SHM} is missing: the lab holds each board's OS in a tmpfs file there; mount one "
                       f"(`mount -t tmpfs tmpfs {SHM}`)")
    done = subprocess.run(
        ["sh", "-c", JOIN, "sh", *map(str, limits.procs_files())],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
             "COMMAND": f"head -c {int(nbytes)} /dev/zero > {shlex.quote(str(path))}"},
        stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0 or not path.is_file() or path.stat().st_size != nbytes:
        path.unlink(missing_ok=True)
        raise LabError(f"the lab device could not hold its OS's {mib(nbytes)} in {path}: "
                       f"{(done.stderr or done.stdout).strip()[-300:] or 'the file is short'}; is {SHM} full "
                       "(`df -h /dev/shm`)?")


def _start(root: Path, spec: LabDevice, client_pub: str, user: str, python: str,
           emulator: str | None = None) -> dict[str, Any]:
    profile = load_profile(spec.profile)
    held_to = lab_budget(spec)
    name = spec.device_name()
    home = root / name
    home.mkdir(parents=True, exist_ok=True)
    (home / "work").mkdir(exist_ok=True)
    _keygen(home / "ssh_host_ed25519_key", f"edgebench-lab-{name}")
    (home / "authorized_keys").write_text(client_pub)
    port = _free_port()
    config = home / "sshd_config"
    config.write_text(_sshd_config(home, port, user, _no_python_login(home) if spec.no_python else None))
    try:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
    except PermissionError:
        raise LabError("sshd needs /run/sshd and the lab needs cgroups: run `edgebench lab up` as root") from None
    memory = int(spec.memory_bytes or profile.emulation.memory_bytes)
    cpus = float(spec.cpus or profile.emulation.cpus)
    limits = Limits.create(_cgroup_name(root, name), memory, cpus)
    os_file = _os_memory_file(root, name)
    _hold_os_memory(limits, os_file, held_to.os_bytes)
    log = home / "sshd.log"
    with open(log, "ab") as log_fh:  # sshd and every session start inside the cgroups
        proc = subprocess.Popen(
            ["sh", "-c", JOIN, "sh", *map(str, limits.procs_files())],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                 "COMMAND": f"{shlex.quote(_sshd())} -D -e -f {shlex.quote(str(config))}"},
            stdin=subprocess.DEVNULL,
            stdout=log_fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_listening(port, proc, log)
    except LabError:
        proc.kill()
        proc.wait()
        if not limits.pids():  # never kill a sweep that still runs in the device
            os_file.unlink(missing_ok=True)
            limits.destroy()
        raise
    host_pub = (home / "ssh_host_ed25519_key.pub").read_text().split()
    (home / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    return {
        "name": name,
        "profile": profile.id,
        "port": port,
        "pid": proc.pid,
        "memory_bytes": memory,
        "cpus": cpus,
        "os_memory_bytes": held_to.os_bytes,
        "os_memory_source": held_to.os_source,
        "os_memory_file": str(os_file),
        "cgroups": [str(d) for d in limits.dirs],
        "cgroup_version": limits.version,
        "home": str(home),
        "python": inventory.NO_PYTHON if spec.no_python else python,
        "emulator": emulator,
    }


def _inventory_entry(root: Path, dev: dict[str, Any], user: str) -> dict[str, Any]:
    home = Path(dev["home"])
    return {
        "profile": dev["profile"],
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": dev["port"],
        "user": user,
        "key": str(root / "client_key"),
        "known_hosts": str(home / "known_hosts"),
        # this machine's interpreter and libraries, or the arm64 emulation root's wrapper
        "python": dev.get("python", sys.executable),
        "workdir": str(home / "work"),
        "lab": str(root),
        # the board it emulates: its own RAM and cores, not the profile's
        "ram_bytes": dev["memory_bytes"],
        "cores": max(1, math.ceil(dev["cpus"])),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def up(devices: list[LabDevice] | None = None,
       step: Callable[[int, str], None] = lambda i, what: None) -> list[dict[str, Any]]:
    """Starts the devices not already running and registers them; returns every lab device.

    An arm64 device builds the emulation root first if it is not cached (`step` hears arm64.STEPS)."""
    for spec in devices or []:
        if (spec.arch or "host") not in ARCHES:
            raise LabError(f"unknown arch {spec.arch!r}; choose one of {', '.join(ARCHES)}")
        lab_budget(spec)  # a memory that leaves a run no room: refused before anything starts
    root = lab_dir()
    root.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    _keygen(root / "client_key", "edgebench-lab-client")
    client_pub = (root / "client_key.pub").read_text()
    state = read_state(root)
    emulation = None
    for spec in devices or [LabDevice(p) for p in DEFAULT_PROFILES]:
        name = spec.device_name()
        if name in state and _alive(state[name]["pid"]):
            continue
        if name in (inventory := read_inventory()) and inventory[name].get("lab") != str(root):
            raise LabError(
                f"inventory already has a device {name!r} that is not this lab's; remove it or pick another name"
            )
        if name in state:  # sshd is gone: restart it, but never kill what still runs in the device
            stale = state.pop(name)
            if Limits([Path(d) for d in stale["cgroups"]], stale["cgroup_version"]).pids():
                _reap(stale["pid"])  # a sweep lives on in the cgroups: the new sshd joins them
            else:
                _stop(stale)
        python, emulator = sys.executable, None
        if ARCHES.get(spec.arch or "host"):
            try:
                emulation = emulation or arm64.ensure(step)
            except arm64.Arm64Error as exc:
                raise LabError(str(exc)) from None
            python, emulator = emulation.python, emulation.emulator
        dev = _start(root, spec, client_pub, user, python, emulator)
        state[name] = dev
        _write_state(root, state)
        with edited_inventory() as entries:
            entries[name] = _inventory_entry(root, dev, user)
    return [state[n] for n in sorted(state)]


def _reap(pid: int) -> None:
    """Reaps a dead sshd if this process started it (no zombie left)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _stop(dev: dict[str, Any]) -> None:
    if _alive(dev["pid"]):
        os.kill(dev["pid"], signal.SIGTERM)
    limits = Limits([Path(d) for d in dev["cgroups"]], dev["cgroup_version"])
    if dev.get("os_memory_file"):  # its pages are the cgroup's: gone first
        Path(dev["os_memory_file"]).unlink(missing_ok=True)
    limits.destroy()
    try:
        os.waitpid(dev["pid"], 0)  # reap it if this process started it (it is dead by now)
    except ChildProcessError:
        pass
    home = Path(dev["home"])
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub", "authorized_keys", "known_hosts",
                 "sshd_config", "sshd.pid"):
        (home / name).unlink(missing_ok=True)


SWEEP_STOP_S = 60.0  # a sweep's running run gets this long to end `interrupted` before the cgroup is killed


def _stop_gracefully(dev: dict[str, Any], log: Callable[[str], None]) -> None:
    """Sweeps running in the device stop as on SIGTERM (the running run ends `interrupted`, result.json
    written; the sweep `interrupted`), before the cgroup is killed; one that does not end in time is
    killed with the rest, and its record closed (devices.device_scripts.sweeps.finalize)."""
    from edgebench.devices.device_scripts import sweeps

    limits = Limits([Path(d) for d in dev["cgroups"]], dev["cgroup_version"])
    running = []
    for pid in limits.pids() if Path(dev["cgroups"][0]).exists() else []:
        try:
            if b"edgebench.runner.sweep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
                running.append(pid)
        except OSError:
            continue
    if running:
        log(f"{dev['name']}: stopping {len(running)} running sweep(s); their running runs end `interrupted`")
    deadline = time.monotonic() + SWEEP_STOP_S
    while any(_alive(pid) for pid in running) and time.monotonic() < deadline:
        time.sleep(0.2)
    _stop(dev)
    root = Path(dev["home"]) / "work" / "sweeps"
    for sweep_dir in sorted(root.iterdir()) if root.is_dir() else []:
        sweeps.sweep_state(str(sweep_dir))  # a sweep killed without ending gets its final record
    if running:
        log(f"{dev['name']}: its runs stay in {root}; `edgebench lab up` then `edgebench collect` brings them in")


def down(purge: bool = False, log: Callable[[str], None] = lambda _: None) -> list[str]:
    """Stops every lab device: no process, cgroup, key or inventory entry is left. A sweep still
    running there is stopped first, so each of its runs ends with a final status.

    The devices' work directories (runs not yet collected) stay unless `purge`, which also removes
    those a plain `down` left before.
    """
    root = lab_dir()
    state = read_state(root)
    for dev in state.values():
        _stop_gracefully(dev, log)
    if purge:
        homes = {Path(dev["home"]) for dev in state.values()}
        homes |= {p.parent for p in root.glob("*/work") if p.is_dir()} if root.is_dir() else set()
        for home in sorted(homes):
            shutil.rmtree(home, ignore_errors=True)
            log(f"purged {home}")
    with edited_inventory() as entries:
        for name in [name for name, entry in entries.items() if entry.get("lab") == str(root)]:
            del entries[name]
    for name in ("client_key", "client_key.pub"):
        (root / name).unlink(missing_ok=True)
    _write_state(root, {})
    return sorted(state)


def status() -> list[dict[str, Any]]:
    """Each lab device with whether its sshd runs and its cgroup memory figures."""
    rows = []
    for _, dev in sorted(read_state().items()):
        limits = Limits([Path(d) for d in dev["cgroups"]], dev["cgroup_version"])
        row = {k: dev[k] for k in ("name", "profile", "port", "pid", "memory_bytes", "cpus")}
        row["running"] = _alive(dev["pid"])
        exists = Path(dev["cgroups"][0]).exists()
        row["processes"] = len(limits.pids()) if exists else 0  # a sweep outlives its sshd
        row["os_memory_bytes"] = dev.get("os_memory_bytes")
        row.update(limits.memory_stats() if exists else {})
        rows.append(row)
    return rows


def drop_connections(name: str) -> int:
    """Kills a device's SSH session processes but not its listener: a dropped network link.

    What runs detached on the device (a sweep) carries on. Returns how many were killed.
    """
    dev = read_state().get(name)
    if dev is None:
        raise LabError(f"no lab device {name!r}; `edgebench lab status` lists them")
    killed = 0
    for pid in Limits([Path(d) for d in dev["cgroups"]], dev["cgroup_version"]).pids():
        try:
            is_sshd = Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd")
        except OSError:
            continue
        if is_sshd and pid != dev["pid"]:
            os.kill(pid, signal.SIGKILL)
            killed += 1
    return killed
