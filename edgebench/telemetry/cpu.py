"""CPU counters as the kernel gives them: the worker tree's ticks, /proc/stat's `cpu` line, the
CPU time of the device's cgroup, core frequencies, and the time the cgroup's CPU quota
throttled the run. Raw readings only (edgebench.figures.readings): the host turns them into
shares (edgebench.figures.cpu and .samples).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from edgebench.telemetry.memory import PerPidFiles, ProcessTree, cgroup_dir, is_hierarchy_root, keyed_values
from edgebench.telemetry.sysfs import PreadFile, SourceUnavailable, read_text, under

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ProcessCpu:
    """`worker_cpu_ticks` of the tree: utime+stime of each member plus the reaped children's
    cutime+cstime, so a child that exits keeps its ticks in its parent's count."""

    name = "process_cpu"

    def __init__(self, tree: ProcessTree):
        self.tree = tree
        self._stat = PerPidFiles(tree.proc, "stat", 1024)
        if self._ticks(0.0) is None:
            raise SourceUnavailable(f"cannot read {tree.proc}/{tree.pid}/stat")

    def _ticks(self, now_s: float) -> int | None:
        texts = self._stat.read(self.tree.pids(now_s))
        if not texts:
            return None
        total = 0
        for text in texts.values():
            fields = text.rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        return total

    def read(self, now_s: float) -> dict[str, int]:
        ticks = self._ticks(now_s)
        return {} if ticks is None else {"worker_cpu_ticks": ticks}

    def close(self) -> None:
        self._stat.close()


class SystemCpu:
    """`proc_stat_cpu`: the fields of /proc/stat's first (`cpu`) line, as read."""

    name = "system_cpu"

    def __init__(self, root: str | Path = "/"):
        self._file = PreadFile(under(root, "/proc/stat"), 256)
        if not self.read(0.0):
            raise SourceUnavailable(f"cannot read {self._file.path}")

    def read(self, now_s: float) -> dict[str, str]:
        text = self._file.read()
        if not text or not text.startswith("cpu "):
            return {}
        return {"proc_stat_cpu": " ".join(text.split("\n", 1)[0].split()[1:])}

    def close(self) -> None:
        self._file.close()


def _quota_cores(version: str, directory: Path) -> float | None:
    """The cores a cgroup's CPU quota allows (cpu.max, or v1 cfs_quota/period); None: no quota."""
    if version == "v2":
        parts = (read_text(directory / "cpu.max") or "max").split()
        quota, period = parts[0], parts[1] if len(parts) > 1 else "100000"
    else:
        quota, period = (
            read_text(directory / "cpu.cfs_quota_us") or "-1",
            read_text(directory / "cpu.cfs_period_us") or "0",
        )
    try:
        cores = int(quota) / int(period)
    except (ValueError, ZeroDivisionError):  # "max" or -1: no quota
        return None
    return cores if cores > 0 else None


class CgroupCpu:
    """`cgroup_cpu_usage_ns`: the CPU time of the CPU-limited cgroup the run lives in (v1
    cpuacct.usage, v2 cpu.stat usage_usec). On a lab device that cgroup is the device, so its
    share of the cores its quota allows (`readings()`) is the device's own CPU use."""

    name = "cgroup_cpu"

    def __init__(self, pid: int, root: str | Path = "/"):
        found = cgroup_dir(pid, "cpu", root)
        if found is None or is_hierarchy_root(found[1]):
            raise SourceUnavailable(f"pid {pid} is in no (non-root) cpu cgroup")
        self.version, directory, self.path = found
        cores = _quota_cores(self.version, directory)
        if cores is None:
            raise SourceUnavailable(f"{directory} has no CPU quota: the cgroup is not a device of its own")
        self.cores = cores
        if self.version == "v2":
            self._usage = directory / "cpu.stat"
        else:  # cpuacct: mounted with cpu ("cpu,cpuacct") or apart, where the lab makes the device a group too
            acct = cgroup_dir(pid, "cpuacct", root)
            if acct is None or is_hierarchy_root(acct[1]):
                raise SourceUnavailable(f"pid {pid} has a CPU quota but no cpuacct group of its own to read its use")
            self._usage = acct[1] / "cpuacct.usage"
        if not self.read(0.0):
            raise SourceUnavailable(f"{self._usage} has no CPU usage counter")

    def read(self, now_s: float) -> dict[str, int]:
        if self.version == "v2":
            usec = keyed_values(self._usage).get("usage_usec")
            return {} if usec is None else {"cgroup_cpu_usage_ns": usec * 1000}
        text = read_text(self._usage)
        return {"cgroup_cpu_usage_ns": int(text)} if text and text.strip().isdigit() else {}

    def readings(self) -> dict[str, object]:
        """The cgroup and the cores its quota allows (meta.json readings.cgroup_cpu)."""
        return {"path": self.path, "cores": self.cores}

    def close(self) -> None:
        pass


class CpuFreq:
    """`cpu<k>_freq_mhz` from cpufreq's scaling_cur_freq."""

    name = "cpu_freq"

    def __init__(self, root: str | Path = "/"):
        base = under(root, "/sys/devices/system/cpu")
        cores = sorted((int(m.group(1)), p) for p in base.glob("cpu[0-9]*")
                       if (m := re.fullmatch(r"cpu(\d+)", p.name)))
        self._files = [(k, PreadFile(p / "cpufreq" / "scaling_cur_freq", 64)) for k, p in cores]
        if not self.read(0.0):
            raise SourceUnavailable(f"no readable {base}/cpu*/cpufreq/scaling_cur_freq (no cpufreq driver, e.g. a VM)")

    def read(self, now_s: float) -> dict[str, float]:
        out = {}
        for k, fh in self._files:
            text = fh.read()
            if text and text.strip().isdigit():
                out[f"cpu{k}_freq_mhz"] = int(text) / 1000.0
        return out

    def close(self) -> None:
        for _, fh in self._files:
            fh.close()


class CgroupCpuThrottle:
    """`cpu_throttled_us`: cumulative time the cgroup's CPU quota held the run back
    (cpu.stat: v1 throttled_time in ns, v2 throttled_usec)."""

    name = "cgroup_cpu_throttle"

    def __init__(self, pid: int, root: str | Path = "/"):
        found = cgroup_dir(pid, "cpu", root)
        if found is None or is_hierarchy_root(found[1]):
            raise SourceUnavailable(f"pid {pid} is in no (non-root) cpu cgroup: no quota, nothing throttles it")
        self.version, directory, _ = found
        self._path = directory / "cpu.stat"
        if not self.read(0.0):
            raise SourceUnavailable(f"{self._path} has no throttled_time/throttled_usec")

    def read(self, now_s: float) -> dict[str, int]:
        stat = keyed_values(self._path)
        if self.version == "v1" and "throttled_time" in stat:
            return {"cpu_throttled_us": stat["throttled_time"] // 1000}
        if "throttled_usec" in stat:
            return {"cpu_throttled_us": stat["throttled_usec"]}
        return {}

    def close(self) -> None:
        pass
