"""First contact with a board: its SSH host key, what it is, and which profile fits it.

One POSIX shell probe (it works before Python is installed, and in adb's shell) prints
`key=value` lines: the device-tree model, arch, RAM (MemTotal, MemAvailable, and the memory
cgroup limit of the probe's own process: what a run started the same way meets), cores, OS,
Pythons, free disk, readable sensors (each power source's lines come from its descriptor,
telemetry/power.py POWER_SOURCES) and the clock. Board files are read under a root directory (`/` on a
device; a fixture tree or an emulated board's files in tests), so tests take the same path.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgebench.devices.inventory import Device
from edgebench.devices.profiles import Profile, ProfileError, list_profiles, load_profile, resolve_profile
from edgebench.devices.profiles import Transport as TransportSettings
from edgebench.devices.transport import Transport, TransportError
from edgebench.telemetry.power import POWER_SOURCES

# Pythons tried when the device's own is not known yet (the last one is Termux's).
PYTHONS = ("python3", "python", "/data/data/com.termux/files/usr/bin/python")

PROBE = r"""
R=${1%/}; W=$2; shift 2
kv() { printf '%s=%s\n' "$1" "$2"; }
kv epoch "$(date +%s.%N 2>/dev/null)"
for f in "$R/proc/device-tree/model" "$R/sys/firmware/devicetree/base/model"; do
  if [ -r "$f" ]; then kv model "$(tr -d '\000' < "$f")"; break; fi
done
kv arch "$(cat "$R/proc/sys/kernel/arch" 2>/dev/null || uname -m)"
kv mem_kib "$(sed -n 's/^MemTotal:[[:space:]]*\([0-9]*\).*/\1/p' "$R/proc/meminfo" 2>/dev/null)"
kv mem_available_kib "$(sed -n 's/^MemAvailable:[[:space:]]*\([0-9]*\).*/\1/p' "$R/proc/meminfo" 2>/dev/null)"
if [ -r "$R/proc/self/cgroup" ]; then
  while IFS=: read -r _ cg_controllers cg_path; do
    case ,$cg_controllers, in
      *,memory,*) cg_file="$R/sys/fs/cgroup/memory$cg_path/memory.limit_in_bytes" ;;
      ,,) cg_file="$R/sys/fs/cgroup$cg_path/memory.max" ;;
      *) continue ;;
    esac
    [ -r "$cg_file" ] && kv mem_limit "$(cat "$cg_file")"
  done < "$R/proc/self/cgroup"
fi
c=$(grep -c '^processor' "$R/proc/cpuinfo" 2>/dev/null)
[ -n "$c" ] && [ "$c" != 0 ] || c=$(getconf _NPROCESSORS_ONLN 2>/dev/null)
kv cores "$c"
kv os "$(sed -n 's/^PRETTY_NAME=//p' "$R/etc/os-release" 2>/dev/null | tr -d '"')"
kv l4t "$(head -n 1 "$R/etc/nv_tegra_release" 2>/dev/null | sed 's/^# *//')"
if command -v getprop >/dev/null 2>&1; then
  kv android_model "$(getprop ro.product.model)"; kv android_release "$(getprop ro.build.version.release)"
elif [ -r "$R/system/build.prop" ]; then
  kv android_model "$(sed -n 's/^ro.product.model=//p' "$R/system/build.prop")"
  kv android_release "$(sed -n 's/^ro.build.version.release=//p' "$R/system/build.prop")"
fi
case "$PREFIX" in *com.termux*) kv termux yes;; esac
for p in "$@"; do
  path=$(command -v "$p" 2>/dev/null) || continue
  v=$("$path" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) || continue
  kv python "$p	$path	$v"
done
mkdir -p "$W" 2>/dev/null
kv workdir "$(cd "$W" 2>/dev/null && pwd)"
kv disk_free_kib "$(df -Pk "$W" 2>/dev/null | sed -n '2p' | tr -s ' ' | cut -d ' ' -f 4)"
for z in "$R"/sys/class/thermal/thermal_zone*; do
  [ -r "$z/type" ] && kv thermal "$(cat "$z/type")	$(cat "$z/temp" 2>/dev/null)"
done
command -v vcgencmd >/dev/null 2>&1 && kv vcgencmd "$(vcgencmd get_throttled 2>&1 | head -n 1)"
command -v systemctl >/dev/null 2>&1 && kv jtop "$(systemctl is-active jtop 2>/dev/null)"
[ -S "$R/run/jtop.sock" ] && kv jtop_socket yes
command -v timedatectl >/dev/null 2>&1 && kv ntp "$(timedatectl show -p NTPSynchronized --value 2>/dev/null)"
""" + "".join(source.probe for source in POWER_SOURCES.values()) + """exit 0
"""


@dataclass
class BoardFacts:
    """What the probe found; lists hold (name, value) pairs, values "" when unreadable."""

    model: str = ""
    arch: str = ""
    ram_bytes: int | None = None  # MemTotal
    mem_available_bytes: int | None = None  # None: the kernel does not say (before Linux 3.14)
    cgroup_limit_bytes: int | None = None  # the memory cgroup's limit (an sshd's, a container's); None: none
    cores: int | None = None
    os: str = ""
    l4t: str = ""  # Jetson Linux release line: the JetPack version follows from it
    android_model: str = ""
    android_release: str = ""
    termux: bool = False
    pythons: list[tuple[str, str, str]] = field(default_factory=list)  # (asked for, path, version)
    workdir: str = ""  # absolute
    disk_free_bytes: int | None = None
    thermal: list[tuple[str, str]] = field(default_factory=list)  # (zone type, m°C)
    # each power source's probe lines, by source name (telemetry.power.POWER_SOURCES), in order
    power: dict[str, list[str]] = field(default_factory=dict)
    vcgencmd: str | None = None  # `vcgencmd get_throttled` (None: not installed)
    jtop: str = ""  # `systemctl is-active jtop`
    jtop_socket: bool = False
    ntp: str = ""  # timedatectl NTPSynchronized: yes | no | "" (not reported)
    clock_offset_s: float | None = None  # device wall clock minus this host's
    clock_uncertainty_s: float | None = None  # half the probe's round trip

    @property
    def board(self) -> str:
        """The model in words: device-tree model, Android model, or the arch."""
        if self.android_model:
            return f"{self.android_model} (Android {self.android_release})".replace(" (Android )", "")
        return self.model or f"unknown {self.arch or 'board'}"

    def ram(self) -> tuple[int | None, str]:
        """The RAM a run can have, the lower of MemTotal and the cgroup limit, and which it is."""
        if self.cgroup_limit_bytes and (self.ram_bytes is None or self.cgroup_limit_bytes < self.ram_bytes):
            return self.cgroup_limit_bytes, "the memory cgroup's limit"
        return self.ram_bytes, "MemTotal"

    def python(self, name: str) -> tuple[str, str] | None:
        """(path, version) of the python asked for as `name`, if it runs."""
        return next(((p, v) for asked, p, v in self.pythons if asked == name), None)


def _int(text: str, top: int = 2**40) -> int | None:
    """A whole number from the probe between 0 and `top` (by default 1 PiB in KiB), else None:
    a board reporting 1e23 kB of RAM reports nothing usable."""
    try:
        number = int(text)
    except ValueError:
        return None
    return number if 0 <= number <= top else None


TEXT_CHARS = 200  # of a board's own words (its model, OS): a board may say 20 MB, shown on one line


def parse_probe(text: str) -> BoardFacts:
    facts = BoardFacts()
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        head, _, tail = value.partition("\t")
        pair = (head, tail)  # (value, "") without a tab
        if key == "workdir":
            facts.workdir = value.strip()
        elif key in ("model", "arch", "os", "l4t", "android_model", "android_release", "jtop", "ntp"):
            setattr(facts, key, value.strip()[:TEXT_CHARS])
        elif key == "mem_kib" and _int(value) is not None:
            facts.ram_bytes = int(value) * 1024
        elif key == "mem_available_kib" and _int(value) is not None:
            facts.mem_available_bytes = int(value) * 1024
        elif key == "mem_limit" and (limit := _int(value, 2**63)) is not None and limit < 1 << 60:  # v1's none: ~2^63
            facts.cgroup_limit_bytes = min(limit, facts.cgroup_limit_bytes or limit)
        elif key == "cores":
            facts.cores = _int(value, 4096) or None
        elif key == "disk_free_kib" and _int(value) is not None:
            facts.disk_free_bytes = int(value) * 1024
        elif key == "python" and value.count("\t") == 2:
            asked, path, version = value.split("\t")
            facts.pythons.append((asked, path, version[:TEXT_CHARS]))
        elif key == "thermal":
            facts.thermal.append(pair)
        elif key in POWER_SOURCES:
            facts.power.setdefault(key, []).append(value)
        elif key == "vcgencmd":
            facts.vcgencmd = value
        elif key in ("termux", "jtop_socket"):
            setattr(facts, key, value == "yes")
    return facts


def probe(transport: Transport, device: Device, pythons: list[str] | None = None) -> BoardFacts:
    """Runs the probe on the device; board files under `device.root`."""
    argv = ["sh", "-c", PROBE, "sh", device.root or "", device.workdir,
            *dict.fromkeys(pythons or [device.python, *PYTHONS])]
    sent = time.time()
    result = transport.run(argv, timeout=60)
    received = time.time()
    if result.rc != 0:
        raise TransportError(
            f"{device.name}: the board probe failed (exit {result.rc}): {result.stderr.strip()[-500:]}"
        )
    facts = parse_probe(result.stdout)
    epoch = re.search(r"^epoch=(\d+)(\.\d+)?", result.stdout, re.M)
    if epoch:  # a date without %N (busybox) gives whole seconds: one more second of doubt
        facts.clock_offset_s = float(epoch.group(1) + (epoch.group(2) or "")) - (sent + received) / 2
        facts.clock_uncertainty_s = (received - sent) / 2 + (0 if epoch.group(2) else 1)
    return facts


# Board models (device-tree `model`, Android's ro.product.model) to profile names, first match wins.
# The names resolve like `--profile` does, so a user's own profile of that family is a candidate too.
BOARD_MODELS = (
    (r"Raspberry Pi (Compute Module )?5", "raspberry-pi-5"),  # also the Pi 500
    (r"Raspberry Pi (Compute Module )?4", "raspberry-pi-4"),  # also the Pi 400
    (r"Raspberry Pi Zero 2", "raspberry-pi-zero-2w"),
    (r"Raspberry Pi", "raspberry-pi"),
    (r"AGX Orin", "jetson-agx-orin"),
    (r"Orin Nano", "jetson-orin-nano"),
    (r"Jetson", "jetson"),
)


def propose_profiles(facts: BoardFacts) -> list[str]:
    """Profile ids that fit the board, closest RAM first; a board no profile of its family fits
    gets its arch's generic one (`linux-x86_64`, `linux-aarch64`); empty: nothing fits."""
    family = next((name for pattern, name in BOARD_MODELS if re.search(pattern, facts.model)), None)
    if facts.android_model or facts.termux:
        family = "android"
    candidates = resolve_profile(family) if family else []
    scored = []
    for pid in candidates:
        try:
            profile = load_profile(pid)
        except ProfileError:
            continue
        if facts.arch and profile.arch != facts.arch:
            continue
        scored.append((abs(int(profile.ram_bytes) - (facts.ram_bytes or 0)), pid))
    generic = f"linux-{facts.arch}"
    if not scored and facts.arch and generic in list_profiles():
        return [generic]
    return [pid for _, pid in sorted(scored)]


def board_figures(facts: BoardFacts, profile: Profile) -> dict[str, int]:
    """The board's own RAM (BoardFacts.ram: a cgroup limit counts) and cores where its profile's
    differ (RAM by more than the kernel's share, cores at all): `devices add` keeps them in the
    board's inventory entry, which wins over the profile, so predictions and fit checks use the board's."""
    own = {}
    ram = facts.ram()[0] or 0
    if ram and not 0.75 * int(profile.ram_bytes) <= ram <= 1.05 * int(profile.ram_bytes):
        own["ram_bytes"] = ram
    if facts.cores and facts.cores != profile.cores:
        own["cores"] = facts.cores
    return own


def profile_mismatches(facts: BoardFacts, profile_id: str) -> list[str]:
    """Where the board differs from the profile (arch: fatal; RAM, cores: its entry keeps the board's)."""
    profile = load_profile(profile_id)
    notes = []
    if facts.arch and facts.arch != profile.arch:
        notes.append(f"the board is {facts.arch} but profile {profile.id} is {profile.arch}")
    own = board_figures(facts, profile)
    if "ram_bytes" in own:
        notes.append(f"{ram_words(facts)}, profile {profile.id} says {int(profile.ram_bytes) / 2**30:.1f} GiB: its "
                     "entry keeps the board's (detected)")
    if "cores" in own:
        notes.append(f"the board has {own['cores']} cores, profile {profile.id} says {profile.cores}: its entry keeps "
                     "the board's (detected)")
    return notes


def ram_words(facts: BoardFacts) -> str:
    """The RAM a run on the board can have (the board reported some), saying where the figure comes from."""
    ram, source = facts.ram()
    if source == "MemTotal":
        return f"the board has {(ram or 0) / 2**30:.1f} GiB of RAM (MemTotal)"
    return (f"the board's runs have {(ram or 0) / 2**30:.1f} GiB of RAM ({source}; MemTotal "
            f"{(facts.ram_bytes or 0) / 2**30:.1f} GiB)")


def no_mem_available(name: str) -> str:
    """What a board whose kernel reports no MemAvailable (before Linux 3.14) leaves unknown."""
    return (f"{name} reports no MemAvailable in /proc/meminfo (a kernel before Linux 3.14): how much RAM a run "
            "could take there now is unknown")


def first_contact_device(name: str, settings: TransportSettings, workdir: str, root: str | None) -> Device:
    """A Device to probe a board whose profile is not chosen yet (only its transport is used)."""
    return Device(name=name, profile=load_profile("local"), transport=settings, python="python3",
                  workdir=workdir, root=root)


# --- host keys -----------------------------------------------------------------------------


@dataclass
class HostKey:
    """The key a server offered: its algorithm, SHA256 fingerprint and known_hosts line."""

    host: str
    port: int
    algorithm: str
    fingerprint: str
    public: Any  # asyncssh.SSHKey

    @property
    def host_spec(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def known_hosts_line(self) -> str:
        return " ".join([self.host_spec, *self.public.export_public_key("openssh").decode().split()[:2]])


def server_host_key(host: str, port: int, timeout_s: float) -> HostKey:
    """The host key the SSH server offers, fetched without trusting or logging in."""
    import asyncssh

    async def fetch() -> Any:
        return await asyncio.wait_for(asyncssh.get_server_host_key(host, port), timeout_s)

    try:
        key = asyncio.run(fetch())
    except (OSError, asyncio.TimeoutError, asyncssh.Error) as exc:
        raise TransportError(
            f"{host}:{port}: cannot reach an SSH server ({str(exc) or type(exc).__name__}); check "
            "that the board is on, sshd runs (`sudo systemctl enable --now ssh`) and the address"
        ) from None
    if key is None:
        raise TransportError(f"{host}:{port}: the server offered no host key to check")
    return HostKey(host, port, key.get_algorithm(), key.get_fingerprint("sha256"), key)


def host_key_status(known_hosts: Path, key: HostKey) -> str:
    """"trusted" (this key is listed), "changed" (another key is, or it is revoked) or "unknown"."""
    import asyncssh

    if not known_hosts.exists():
        return "unknown"
    trusted, _, revoked, *_ = asyncssh.read_known_hosts(str(known_hosts)).match(key.host, "", key.port)
    data = key.public.public_data
    if any(k.public_data == data for k in revoked):
        return "changed"
    if any(k.public_data == data for k in trusted):
        return "trusted"
    return "changed" if trusted else "unknown"


def same_fingerprint(given: str, key: HostKey) -> bool:
    """`given` as ssh-keygen -l prints it (`SHA256:...`), with or without the prefix."""
    return given.strip().removeprefix("SHA256:") == key.fingerprint.removeprefix("SHA256:")


def trust(known_hosts: Path, key: HostKey) -> None:
    """Appends the key to known_hosts (created 0600 in a 0700 folder if missing)."""
    known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(key.known_hosts_line() + "\n")


def keygen_hint(key: HostKey) -> str:
    """The command that prints this key's fingerprint on the board itself, to compare."""
    kind = {"ssh-ed25519": "ed25519", "ecdsa-sha2-nistp256": "ecdsa", "ssh-rsa": "rsa"}.get(key.algorithm, "*")
    return f"ssh-keygen -lf /etc/ssh/ssh_host_{kind}_key.pub"

