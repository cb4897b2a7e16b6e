"""Memory of a process tree, of the system, and of the cgroup the process lives in.

RSS comes from /proc/PID/statm (the same counter the kernel's ru_maxrss high-water mark
tracks), cheap enough for every sample. USS/PSS need /proc/PID/smaps_rollup, which walks
the page tables under the process's mmap lock, so they are read at a lower rate. The
cgroup's own counters (usage, peak, limit, OOM kills) are the kernel's ground truth; note
that cgroup usage includes page cache, so compare RSS with `total_rss` (v1) / `anon` (v2).
"""

from __future__ import annotations

import os
from pathlib import Path

from edgebench.telemetry.sysfs import PreadFile, SourceUnavailable, read_int, read_text, under

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
UNLIMITED = 1 << 60  # v1 reports "no limit" as a huge number near 2**63


class ProcessTree:
    """The pid and its descendants; the list is refreshed at most every `refresh_s`."""

    def __init__(self, pid: int, root: str | Path = "/", refresh_s: float = 0.5):
        self.pid = pid
        self.proc = under(root, "/proc")
        self.refresh_s = refresh_s
        self._pids: list[int] = []
        self._listed_at: float | None = None
        self._has_children_files = (self.proc / str(pid) / "task" / str(pid) / "children").exists()

    def pids(self, now_s: float) -> list[int]:
        if self._listed_at is None or now_s - self._listed_at >= self.refresh_s:
            self._pids = self._list()
            self._listed_at = now_s
        return self._pids

    def _list(self) -> list[int]:
        if not (self.proc / str(self.pid)).exists():
            return []
        if self._has_children_files:
            return self._list_from_children_files()
        return self._list_from_ppids()

    def _list_from_children_files(self) -> list[int]:
        """Walks /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN): no full /proc scan."""
        found, queue = [self.pid], [self.pid]
        while queue:
            pid = queue.pop()
            try:
                tids = os.listdir(self.proc / str(pid) / "task")
            except OSError:
                continue
            for tid in tids:
                for child in (read_text(self.proc / str(pid) / "task" / tid / "children") or "").split():
                    found.append(int(child))
                    queue.append(int(child))
        return found

    def _list_from_ppids(self) -> list[int]:
        """Fallback for kernels without children files: one scan of /proc/*/stat."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir(self.proc):
            if entry.isdigit():
                stat = read_text(self.proc / entry / "stat")
                if stat:
                    ppid = int(stat.rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(entry))
        found, queue = [self.pid], [self.pid]
        while queue:
            for child in children.get(queue.pop(), []):
                found.append(child)
                queue.append(child)
        return found


class PerPidFiles:
    """One kept-open file per pid of the tree (statm, stat, ...), closed when a pid leaves."""

    def __init__(self, proc: Path, name: str, size: int = 4096):
        self.proc, self.name, self.size = proc, name, size
        self._files: dict[int, PreadFile] = {}

    def read(self, pids: list[int]) -> dict[int, str]:
        for gone in set(self._files) - set(pids):
            self._files.pop(gone).close()
        out = {}
        for pid in pids:
            fh = self._files.get(pid)
            if fh is None:
                fh = self._files[pid] = PreadFile(self.proc / str(pid) / self.name, self.size)
            text = fh.read()
            if text is not None:
                out[pid] = text
        return out

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()


class ProcessRss:
    """`rss_bytes`: resident set of the whole tree, from statm (every sample)."""

    name = "process_rss"

    def __init__(self, tree: ProcessTree):
        self.tree = tree
        self._statm = PerPidFiles(tree.proc, "statm", 256)
        if not self.read(0.0):
            raise SourceUnavailable(f"cannot read {tree.proc}/{tree.pid}/statm (no such process?)")

    def read(self, now_s: float) -> dict[str, int]:
        pages = sum(int(text.split()[1]) for text in self._statm.read(self.tree.pids(now_s)).values())
        return {"rss_bytes": pages * PAGE_SIZE} if pages else {}

    def close(self) -> None:
        self._statm.close()


class ProcessUssPss:
    """`uss_bytes` (private pages) and `pss_bytes` (proportional share) of the tree."""

    name = "process_uss_pss"

    def __init__(self, tree: ProcessTree):
        self.tree = tree
        self._rollup = PerPidFiles(tree.proc, "smaps_rollup", 8192)
        if not self.read(0.0):
            raise SourceUnavailable(f"cannot read {tree.proc}/{tree.pid}/smaps_rollup (kernel < 4.14 or no permission)")

    def read(self, now_s: float) -> dict[str, int]:
        uss = pss = 0
        texts = self._rollup.read(self.tree.pids(now_s))
        for text in texts.values():
            for line in text.splitlines():
                key, _, rest = line.partition(":")
                if key == "Pss":
                    pss += int(rest.split()[0]) * 1024
                elif key in ("Private_Clean", "Private_Dirty", "Private_Hugetlb"):
                    uss += int(rest.split()[0]) * 1024
        return {"uss_bytes": uss, "pss_bytes": pss} if texts and pss else {}

    def close(self) -> None:
        self._rollup.close()


class SystemMemory:
    """`mem_available_bytes` from /proc/meminfo (the kernel's estimate of what can be had)."""

    name = "system_memory"

    def __init__(self, root: str | Path = "/"):
        self._file = PreadFile(under(root, "/proc/meminfo"), 8192)
        if not self.read(0.0):
            raise SourceUnavailable(f"no MemAvailable in {self._file.path} (kernel < 3.14?)")

    def read(self, now_s: float) -> dict[str, int]:
        for line in (self._file.read() or "").splitlines():
            if line.startswith("MemAvailable:"):
                return {"mem_available_bytes": int(line.split()[1]) * 1024}
        return {}

    def close(self) -> None:
        self._file.close()


def _mountinfo_dirs(root: str | Path, controller: str | None) -> list[tuple[str, Path]]:
    """(mount root, mount point) of cgroup v1 mounts of `controller`, or of cgroup2 when None."""
    text = read_text(under(root, "/proc/self/mountinfo")) or ""
    out = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        fstype, options = tail[0], tail[2].split(",")
        wanted = fstype == "cgroup2" if controller is None else (fstype == "cgroup" and controller in options)
        if wanted:
            out.append((fields[3], under(root, fields[4])))
    return out


def cgroup_dir(pid: int, controller: str, root: str | Path = "/") -> tuple[str, Path, str] | None:
    """(version, directory, cgroup path) of `pid`'s cgroup for `memory`, `cpu` or `cpuacct`
    (v1's CPU usage counters; on v2 the cpu controller's cpu.stat has them), or None.

    Reads /proc/PID/cgroup; v1 hierarchies are tried before the v2 one (hybrid hosts put
    controllers on v1). Mount points come from mountinfo, else the usual /sys/fs/cgroup.
    """
    probe = {"memory": ("memory.usage_in_bytes", "memory.current"), "cpu": ("cpu.stat", "cpu.stat"),
             "cpuacct": ("cpuacct.usage", "cpu.stat")}[controller]
    lines = (read_text(under(root, f"/proc/{pid}/cgroup")) or "").splitlines()
    entries = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    for version, hierarchy, probe_file in (("v1", controller, probe[0]), ("v2", None, probe[1])):
        for _, controllers, path in entries:
            if (version == "v1" and controller in controllers.split(",")) or (version == "v2" and controllers == ""):
                mounts = _mountinfo_dirs(root, hierarchy) or [
                    ("/", under(root, f"/sys/fs/cgroup/{controllers}" if version == "v1" else "/sys/fs/cgroup")),
                    ("/", under(root, "/sys/fs/cgroup/unified")),
                ]
                for mount_root, mount_point in mounts:
                    if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
                        relative = path[len(mount_root):].strip("/")
                        directory = mount_point / relative
                        if (directory / probe_file).exists():
                            return version, directory, relative
    return None


def is_hierarchy_root(directory: Path) -> bool:
    """True for the real root of a v1 hierarchy (whose counters are system-wide). A cgroup
    namespace's root ("/" in /proc/PID/cgroup inside a container) is a real cgroup."""
    return (directory / "cgroup.sane_behavior").exists()


def keyed_values(path: Path) -> dict[str, int]:
    """`key value` lines (memory.stat, memory.events, cpu.stat) as a dict."""
    out = {}
    for line in (read_text(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def oom_kill_count(pid: int, root: str | Path = "/") -> tuple[Path, int] | None:
    """Where the kernel counts the OOM kills that can take `pid`, and the count now: its
    memory cgroup's `oom_kill` (v1 memory.oom_control, v2 memory.events), else the system's
    (/proc/vmstat: a kill anywhere counts). Read at a run's start, it lets a run whose
    supervisor died too be told `oom` later (devices/device_scripts/sweeps.py)."""
    found = cgroup_dir(pid, "memory", root)
    if found is not None and not is_hierarchy_root(found[1]):
        path = oom_kill_file(*found[:2])
    else:
        path = under(root, "/proc/vmstat")
    count = keyed_values(path).get("oom_kill")
    return None if count is None else (path, count)


def oom_kill_file(version: str, directory: Path) -> Path:
    """The memory cgroup's file with the `oom_kill` count of its own processes: v1
    memory.oom_control; v2 memory.events.local (memory.events also counts its children's)."""
    if version == "v1":
        return directory / "memory.oom_control"
    local = directory / "memory.events.local"
    return local if local.exists() else directory / "memory.events"


class CgroupMemory:
    """The pid's memory cgroup (v1 or v2), read as the kernel counts it.

    `read()` (every sample): `cgroup_usage_bytes`. `counters()` (lower rate, and at the
    end): `cgroup_peak_bytes` (the kernel's high-water mark), `cgroup_rss_bytes` (anonymous
    memory: v1 total_rss, v2 anon; usage also counts page cache), `cgroup_limit_bytes`
    (absent when unlimited), `cgroup_oom_kills`.
    """

    name = "cgroup_memory"

    def __init__(self, pid: int, root: str | Path = "/"):
        found = cgroup_dir(pid, "memory", root)
        if found is None:
            names = " | ".join((read_text(under(root, f"/proc/{pid}/cgroup")) or "unreadable").splitlines())
            raise SourceUnavailable(f"pid {pid}: no memory cgroup with counters under {under(root, '/sys/fs/cgroup')} "
                                    f"(/proc/{pid}/cgroup: {names}; the v2 root cgroup has none)")
        self.version, self.dir, self.path = found
        if is_hierarchy_root(self.dir):
            raise SourceUnavailable(f"pid {pid} is in the root memory cgroup ({self.dir}): no per-run usage or peak; "
                                    "run it inside a cgroup (the lab does) to get the kernel's peak")
        v1 = self.version == "v1"
        self._usage = PreadFile(self.dir / ("memory.usage_in_bytes" if v1 else "memory.current"), 64)
        self._peak_path = self.dir / ("memory.max_usage_in_bytes" if v1 else "memory.peak")
        self._limit_path = self.dir / ("memory.limit_in_bytes" if v1 else "memory.max")
        self._stat_path = self.dir / "memory.stat"
        self._rss_key = "total_rss" if v1 else "anon"
        self._oom_path = oom_kill_file(self.version, self.dir)

    def read(self, now_s: float = 0.0) -> dict[str, int]:
        text = self._usage.read()
        return {"cgroup_usage_bytes": int(text)} if text else {}

    def counters(self, now_s: float = 0.0) -> dict[str, int]:
        out = {}
        peak = read_int(self._peak_path)
        if peak is not None:
            out["cgroup_peak_bytes"] = peak
        rss = keyed_values(self._stat_path).get(self._rss_key)
        if rss is not None:
            out["cgroup_rss_bytes"] = rss
        limit = read_int(self._limit_path)  # v2 "max" reads as None: unlimited
        if limit is not None and limit < UNLIMITED:
            out["cgroup_limit_bytes"] = limit
        kills = keyed_values(self._oom_path).get("oom_kill")
        if kills is not None:
            out["cgroup_oom_kills"] = kills
        return out

    def reset_peak(self) -> str | None:
        """Restarts the v1 high-water mark (0 into max_usage_in_bytes: it becomes the current
        usage) so the peak covers this run, not the group's lifetime. None when done, else why not."""
        if self.version != "v1":
            return "cgroup v2 memory.peak cannot be reset for every reader: use a fresh cgroup per run"
        try:
            self._peak_path.write_text("0\n")
            return None
        except OSError as exc:
            return f"cannot write {self._peak_path}: {exc.strerror}"

    def close(self) -> None:
        self._usage.close()
