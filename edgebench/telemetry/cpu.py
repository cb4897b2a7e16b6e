"""CPU: utilisation of the process tree, of the device's cgroup and of the system, core
frequencies, and the time the cgroup's CPU quota throttled the run.

`cpu_proc_pct` follows top's convention (100 = one core busy); `cpu_sys_pct` is the
whole machine (100 = every core busy); `cpu_cgroup_pct` is a CPU-limited cgroup (a lab
device: 100 = every core its quota allows busy). All are rates over the time since the
last read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from edgebench.telemetry.memory import PerPidFiles, ProcessTree, cgroup_dir, is_hierarchy_root, keyed_values
from edgebench.telemetry.sysfs import PreadFile, SourceUnavailable, read_text, under

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class _Rate:
    """Turns a cumulative counter into a rate per second between reads."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def update(self, now_s: float, value: float) -> float | None:
        last, self._last = self._last, (now_s, value)
        if last is None or now_s <= last[0]:
            return None
        return max(0.0, value - last[1]) / (now_s - last[0])


class ProcessCpu:
    """`cpu_proc_pct` of the tree: utime+stime of each member plus the reaped children's
    cutime+cstime, so a child that exits keeps its ticks in its parent's count."""

    name = "process_cpu"

    def __init__(self, tree: ProcessTree):
        self.tree = tree
        self._stat = PerPidFiles(tree.proc, "stat", 1024)
        self._rate = _Rate()
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

    def read(self, now_s: float) -> dict[str, float]:
        ticks = self._ticks(now_s)
        rate = None if ticks is None else self._rate.update(now_s, ticks)
        return {} if rate is None else {"cpu_proc_pct": round(100.0 * rate / CLOCK_TICKS, 2)}

    def close(self) -> None:
        self._stat.close()


class SystemCpu:
    """`cpu_sys_pct`: busy share of all cores from the first line of /proc/stat."""

    name = "system_cpu"

    def __init__(self, root: str | Path = "/"):
        self._file = PreadFile(under(root, "/proc/stat"), 256)
        self._last: tuple[int, int] | None = None
        if self._times() is None:
            raise SourceUnavailable(f"cannot read {self._file.path}")

    def _times(self) -> tuple[int, int] | None:
        text = self._file.read()
        if not text or not text.startswith("cpu "):
            return None
        values = [int(v) for v in text.split("\n", 1)[0].split()[1:9]]  # up to steal; guest is inside user
        idle = values[3] + values[4]  # idle + iowait
        return sum(values), idle

    def read(self, now_s: float) -> dict[str, float]:
        times = self._times()
        last, self._last = self._last, times
        if times is None or last is None or times[0] <= last[0]:
            return {}
        total, idle = times[0] - last[0], times[1] - last[1]
        return {"cpu_sys_pct": round(100.0 * (total - idle) / total, 2)}

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
    """`cpu_cgroup_pct`: how busy the CPU-limited cgroup the run lives in is (cpu.stat
    usage_usec, v1 cpuacct.usage), as a share of the cores its quota allows. On a lab device
    that cgroup is the device, so this is the device's own CPU use; other processes of the
    host are not in it."""

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
        self._rate = _Rate()
        if self._usage_s() is None:
            raise SourceUnavailable(f"{self._usage} has no CPU usage counter")

    def _usage_s(self) -> float | None:
        if self.version == "v2":
            usec = keyed_values(self._usage).get("usage_usec")
            return None if usec is None else usec / 1e6
        text = read_text(self._usage)
        return int(text) / 1e9 if text and text.strip().isdigit() else None

    def read(self, now_s: float) -> dict[str, float]:
        used = self._usage_s()
        rate = None if used is None else self._rate.update(now_s, used)
        return {} if rate is None else {"cpu_cgroup_pct": round(min(100.0, 100.0 * rate / self.cores), 2)}

    def describe(self) -> str:
        return f"the CPU use of its cgroup {self.path} ({self.cores:g} core{'' if self.cores == 1 else 's'})"

    def close(self) -> None:
        pass


class CpuFreq:
    """`cpu_freq_mhz` (mean over cores) and `cpu<k>_freq_mhz` from cpufreq's scaling_cur_freq."""

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
        if out:
            out["cpu_freq_mhz"] = round(sum(out.values()) / len(out), 1)
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
