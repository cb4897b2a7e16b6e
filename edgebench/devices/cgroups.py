"""Memory and CPU limits for emulated devices, through the kernel's cgroups (v1 or v2).

v1 (this machine): /sys/fs/cgroup/memory/<name> (memory.limit_in_bytes) and
/sys/fs/cgroup/cpu/<name> (cpu.cfs_quota_us). v2: /sys/fs/cgroup/<name> with memory.max
and cpu.max. A process joins by writing its pid to cgroup.procs; children inherit.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from edgebench.errors import EdgebenchError

ROOT = Path("/sys/fs/cgroup")
CFS_PERIOD_US = 100_000


class CgroupError(EdgebenchError, RuntimeError):
    """The limits cannot be set up here; the message says why and what to do."""


def cgroup_version(root: Path = ROOT) -> int:
    """2 when the unified hierarchy holds the memory controller, else 1."""
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return 2
    if (root / "memory" / "memory.limit_in_bytes").exists():
        return 1
    raise CgroupError(
        f"no memory cgroup controller under {root} (neither v1 memory/ nor v2 memory.max); the lab needs one"
    )


def own_group(controller: str, proc_cgroup: Path = Path("/proc/self/cgroup")) -> str:
    """This process's v1 group for `controller`, relative: lab groups nest inside it, so any
    limit already placed on us (a container, a CI job) still holds for the emulated devices."""
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return ""


def remove_empty_groups(parent: str, older_than_s: float = 60.0, root: Path = ROOT) -> list[Path]:
    """The groups under `parent` (in every controller) with no process left, made more than
    `older_than_s` ago, removed: what a bench killed before its cleanup left of its runs' groups
    (a younger one may be about to take its run's processes). Returns what was removed."""
    try:
        version = cgroup_version(root)
    except CgroupError:
        return []
    bases = [root / parent] if version == 2 else \
        [root / c / own_group(c) / parent for c in ("memory", "cpu", "cpuacct")]
    removed = []
    for base in bases:
        for group in base.iterdir() if base.is_dir() else []:
            try:
                if group.is_dir() and not (group / "cgroup.procs").read_text().split() and \
                        time.time() - group.stat().st_mtime > older_than_s:
                    group.rmdir()
                    removed.append(group)
            except OSError:
                continue  # in use again, or gone meanwhile
    return removed


@dataclass
class Limits:
    """One emulated device's cgroup directories (one per controller on v1, one on v2).

    Names are `<lab group>/<device>`, so one lab's devices share a parent group.
    """

    dirs: list[Path]
    version: int

    @classmethod
    def create(cls, name: str, memory_bytes: int, cpus: float, root: Path = ROOT) -> Limits:
        version = cgroup_version(root)
        quota = max(1000, int(cpus * CFS_PERIOD_US))
        try:
            if version == 1:
                mem = root / "memory" / own_group("memory") / name
                cpu = root / "cpu" / own_group("cpu") / name
                mem.mkdir(parents=True, exist_ok=True)
                cpu.mkdir(parents=True, exist_ok=True)
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                (cpu / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                (cpu / "cpu.cfs_quota_us").write_text(str(quota))
                dirs = [mem, cpu]
                if not (cpu / "cpuacct.usage").exists() and (root / "cpuacct").is_dir():
                    # cpuacct mounted apart from cpu: the device's CPU use (its power estimate) is read there
                    acct = root / "cpuacct" / own_group("cpuacct") / name
                    acct.mkdir(parents=True, exist_ok=True)
                    dirs.append(acct)
                return cls(dirs, 1)
            parent = root / name.split("/")[0]
            parent.mkdir(exist_ok=True)
            (root / "cgroup.subtree_control").write_text("+memory +cpu")
            (parent / "cgroup.subtree_control").write_text("+memory +cpu")
            group = root / name
            group.mkdir(exist_ok=True)
            (group / "memory.max").write_text(str(memory_bytes))
            if (group / "memory.swap.max").exists():
                (group / "memory.swap.max").write_text("0")
            (group / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
            return cls([group], 2)
        except PermissionError as exc:
            raise CgroupError(
                f"cannot write cgroup limits ({exc}); run the lab as root, or on cgroup v2 delegate a subtree "
                "to your user (systemd-run --user --scope -p Delegate=yes ...)"
            ) from None

    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files():
            if path.exists():
                found.update(int(p) for p in path.read_text().split())
        return found

    def memory_stats(self) -> dict[str, int]:
        """Usage, limit, peak and OOM kills, named the same on v1 and v2."""
        mem = self.dirs[0]
        if self.version == 1:
            def read(name: str) -> int:
                return int((mem / name).read_text())

            oom = dict(line.split() for line in (mem / "memory.oom_control").read_text().splitlines())
            return {
                "usage_bytes": read("memory.usage_in_bytes"),
                "limit_bytes": read("memory.limit_in_bytes"),
                "peak_bytes": read("memory.max_usage_in_bytes"),
                "oom_kills": int(oom.get("oom_kill", 0)),
            }
        events = dict(line.split() for line in (mem / "memory.events").read_text().splitlines())
        peak = mem / "memory.peak"
        limit = (mem / "memory.max").read_text().strip()
        return {
            "usage_bytes": int((mem / "memory.current").read_text()),
            "limit_bytes": -1 if limit == "max" else int(limit),
            "peak_bytes": int(peak.read_text()) if peak.exists() else -1,
            "oom_kills": int(events.get("oom_kill", 0)),
        }

    def destroy(self, timeout_s: float = 10.0) -> None:
        """Kills every process left inside, then removes the groups."""
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise CgroupError(f"processes {sorted(pids)} in {self.dirs[0]} survive SIGKILL")
            time.sleep(0.05)
        for directory in self.dirs:
            for _ in range(100):  # rmdir fails briefly while the kernel reaps the last task
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                raise CgroupError(f"cannot remove {directory}; remove it by hand with rmdir")
        for directory in self.dirs:
            try:
                directory.parent.rmdir()  # the lab's group, once its last device is gone
            except OSError:
                pass  # other devices of the same lab still use it
