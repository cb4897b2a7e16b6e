"""The sampler: one daemon thread that samples a process tree and the device's sensors.

Built in the supervisor and pointed at the worker's pid. Each tick writes one flat JSON
line (flushed) with `t_ns` (monotonic) and whatever was due: RSS and cgroup usage every
tick; the costlier sources at their own lower rates (`INTERVALS_S`), so a line carries
only the keys read at that tick. Every key is a raw reading (edgebench.figures.readings);
`readings()` says where each was read, for meta.json, and the host makes the figures. Every
source is optional and detected at `start()`; the summary from `stop()` lists the active
ones and why each other one is absent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from edgebench.telemetry import cpu, gpu, memory, power, thermal
from edgebench.telemetry.sysfs import ProfileMismatch, Runner, SourceUnavailable, run_command
from edgebench.telemetry.trace import TraceWriter

MAX_RATE_HZ = 100.0

# Seconds between reads of each source (0: every tick). The per-pid /proc reads are the
# cheap ones; smaps_rollup walks page tables under the worker's mmap lock (~10 ms for a
# torch process here), vcgencmd is a process spawn. Power sources' readers: their descriptors'
# (telemetry.power.POWER_SOURCES).
INTERVALS_S = {
    "process_rss": 0.0,
    "cgroup_memory": 0.0,
    "system_memory": 0.1,
    "process_cpu": 0.1,
    "system_cpu": 0.1,
    "cgroup_cpu": 0.1,
    "jetson_gpu_load": 0.1,
    "nvml_gpu": 0.1,
    "cgroup_memory_counters": 0.5,
    "cpu_freq": 0.5,
    "cgroup_cpu_throttle": 0.5,
    "thermal_zones": 0.5,
    "hwmon_temps": 0.5,
    "process_uss_pss": 1.0,
    "pi_throttled": 1.0,
    **power.reader_intervals(),
}

# A slow source (interval >= SLOW_S) is read at most every CORE_SHARE_DIVISOR x its own
# last read time, so none takes more than 0.5 % of a core however big the process grows
# (smaps_rollup of a 2 GB process takes tens of ms).
SLOW_S = 0.5
CORE_SHARE_DIVISOR = 200

class _Source(Protocol):
    """What the sampler drives of every source: its reads (a sample's keys) and its release."""

    def read(self, now_s: float) -> dict[str, Any]: ...

    def close(self) -> None: ...


T = TypeVar("T")
S = TypeVar("S", bound=_Source)


@dataclass
class _Scheduled:
    name: str
    interval_s: float
    read: Callable[[float], dict[str, Any]]
    due_s: float = 0.0


def check_sensors(sensors: Any) -> dict[str, Any]:
    """The profile's sensors block (None: {}) when it has the shape the sources read: an object
    whose `power` is an object and whose `thermal_zones` and `power.rails` are lists of names;
    ProfileMismatch naming the field otherwise (the sources then check each value)."""
    example = '{"power": {"source": "rapl"}, "thermal_zones": ["cpu-thermal"]}'
    if sensors is None:
        return {}
    if not isinstance(sensors, dict):
        raise ProfileMismatch(f"the sensors block is a {type(sensors).__name__}; give an object of settings, "
                              f"e.g. {example}")
    block = sensors.get("power")
    if block is not None and not isinstance(block, dict):
        raise ProfileMismatch(f"sensors.power is a {type(block).__name__}; give an object, e.g. {example}")
    for where, names in (("sensors.thermal_zones", sensors.get("thermal_zones")),
                         ("sensors.power.rails", (block or {}).get("rails"))):
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise ProfileMismatch(f"{where} is {names!r}; give a list of names (or [\"*\"] for every one)")
    return sensors


class Sampler:
    """Samples the process tree of `pid` and this device's sensors into `out_path` (JSONL).

    `root`: filesystem root for /proc and /sys (fixture trees in tests). `sensors`: the
    device profile's sensors block (`power.source`, `power.rails`, `power.total_rail`,
    `power.battery_current_sign`, `thermal_zones`, `throttle`); empty means detect all.
    `runner`: runs device commands (vcgencmd), argv -> stdout.
    """

    def __init__(self, out_path: str | Path, pid: int, rate_hz: float = 20.0, root: str | Path = "/",
                 sensors: dict[str, Any] | None = None, runner: Runner | None = None):
        if not 0 < rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"sampling rate {rate_hz} Hz is out of range: use 0 < rate_hz <= {MAX_RATE_HZ:g}")
        self.out_path, self.pid, self.rate_hz, self.root = Path(out_path), pid, float(rate_hz), root
        self.sensors = check_sensors(sensors)
        self.runner = runner or run_command
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._schedule: list[_Scheduled] = []
        self._closers: list[Callable[[], None]] = []
        self._active: list[str] = []
        self._unavailable: dict[str, str] = {}
        self._failed: dict[str, str] = {}
        self._samples = 0
        self._cost_ns_total = 0
        self._cost_ns_max = 0
        self._started_ns = self._stopped_ns = 0
        self._cgroup: memory.CgroupMemory | None = None
        self._cgroup_start: dict[str, int] = {}
        self._cgroup_peak_scope: str | None = None
        self._power_source: power.PowerReader | None = None
        self._cgroup_cpu: cpu.CgroupCpu | None = None
        self._temperatures: list[thermal.ThermalZones | thermal.HwmonTemps] = []
        self._summary: dict[str, Any] | None = None
        self._error: str | None = None

    # -- detection ------------------------------------------------------------------------

    def _make(self, name: str, make: Callable[[], T]) -> T | None:
        """Builds one source; a missing one is noted, a broken one (odd format, bad
        setting) is reported as failed: neither stops the run."""
        try:
            return make()
        except SourceUnavailable as exc:
            self._unavailable[name] = str(exc)
        except Exception as exc:
            self._failed[name] = f"{type(exc).__name__}: {exc}"
        return None

    def _try(self, name: str, make: Callable[[], S]) -> S | None:
        """Builds a source and schedules its reads; None if it cannot be built or scheduled."""
        source = self._make(name, make)
        if source is not None:
            self._closers.append(source.close)
            if not self._add(name, source.read):
                return None
        return source

    def _add(self, name: str, read: Callable[[float], dict[str, Any]]) -> bool:
        """Schedules a source's reads at its interval. Never raises (it runs outside `_make`'s
        guard): a source with no interval is reported as failed and not read, the run goes on."""
        interval = INTERVALS_S.get(name)
        if interval is None:
            self._failed[name] = f"no sampling interval for source {name!r} (telemetry.sampler.INTERVALS_S)"
            return False
        self._schedule.append(_Scheduled(name, interval, read))
        self._active.append(name)
        return True

    def _detect(self) -> None:
        root, sensors = self.root, self.sensors
        tree = memory.ProcessTree(self.pid, root)
        self._try("process_rss", lambda: memory.ProcessRss(tree))
        self._try("process_uss_pss", lambda: memory.ProcessUssPss(tree))
        self._try("system_memory", lambda: memory.SystemMemory(root))
        self._cgroup = self._try("cgroup_memory", lambda: memory.CgroupMemory(self.pid, root))
        if self._cgroup is not None:
            self._add("cgroup_memory_counters", self._cgroup.counters)
            self._cgroup_start = self._cgroup.counters()
            why_not = self._cgroup.reset_peak()
            self._cgroup_peak_scope = "run" if why_not is None else f"cgroup lifetime ({why_not})"
        self._try("process_cpu", lambda: cpu.ProcessCpu(tree))
        self._try("system_cpu", lambda: cpu.SystemCpu(root))
        self._cgroup_cpu = self._try("cgroup_cpu", lambda: cpu.CgroupCpu(self.pid, root))
        self._try("cpu_freq", lambda: cpu.CpuFreq(root))
        self._try("cgroup_cpu_throttle", lambda: cpu.CgroupCpuThrottle(self.pid, root))

        found = self._make("power", lambda: power.measured_power_source(root, self.runner, sensors))
        source, reasons = found or (None, {})
        self._unavailable.update(reasons)
        if source is not None:
            self._power_source = self._try(source.name, lambda: source)

        zones = [z for z in sensors.get("thermal_zones") or [] if z != "*"] or None
        zone_source = self._try("thermal_zones", lambda: thermal.ThermalZones(root, zones))
        mirrored = zone_source.chip_names if zone_source else set()
        hwmon = self._try("hwmon_temps", lambda: thermal.HwmonTemps(root, mirrored))
        self._temperatures = [t for t in (zone_source, hwmon) if t is not None]
        if sensors.get("throttle", "vcgencmd") == "vcgencmd":
            self._try("pi_throttled", lambda: thermal.PiThrottled(self.runner))
        else:
            self._unavailable["pi_throttled"] = f"the profile says throttle: {sensors.get('throttle')}"
        if self._try("jetson_gpu_load", lambda: gpu.JetsonGpuLoad(root)) is None:
            self._try("nvml_gpu", lambda: gpu.NvmlGpu())

    # -- the thread -----------------------------------------------------------------------

    def start(self) -> Sampler:
        if self._thread is not None:
            raise RuntimeError("Sampler.start() called twice")
        self._writer = TraceWriter(self.out_path)
        try:
            self._detect()
        except BaseException:  # nothing stays open behind a sampler that did not start
            self._writer.close()
            for close in self._closers:
                try:
                    close()
                except Exception:
                    pass
            raise
        self._started_ns = time.monotonic_ns()
        for item in self._schedule:  # detection read every source once: the next reads wait their turn
            item.due_s = self._started_ns / 1e9 + item.interval_s
        self._thread = threading.Thread(target=self._run, name=f"edgebench-sampler-{self.pid}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # e.g. the disk filled up: the summary says so, the run goes on
            self._error = f"sampling stopped early: {type(exc).__name__}: {exc}"

    def _loop(self) -> None:
        period = 1.0 / self.rate_hz
        next_s = time.monotonic()
        while not self._stop.is_set():
            self.sample_once(period)
            next_s += period
            delay = next_s - time.monotonic()
            if delay < 0:  # fell behind (a slow sensor, a busy machine): skip, don't burst
                next_s, delay = time.monotonic(), 0.0
            if self._stop.wait(delay):
                break

    def sample_once(self, period_s: float = 0.0) -> dict[str, Any]:
        """Reads every due source and writes one line; returns it."""
        started = time.thread_time_ns()  # CPU time, not wall: what sampling takes from the device
        t_ns = time.monotonic_ns()
        now_s = t_ns / 1e9
        rec: dict[str, Any] = {"t_ns": t_ns}
        for item in self._schedule:
            if now_s + period_s / 2 < item.due_s:
                continue
            read_started = time.perf_counter()
            try:
                rec.update(item.read(now_s))
            except Exception as exc:  # a sensor that breaks mid-run is dropped, not fatal
                self._failed[item.name] = f"{type(exc).__name__}: {exc}"
                self._schedule = [s for s in self._schedule if s is not item]
            interval = item.interval_s
            if interval >= SLOW_S:
                interval = max(interval, CORE_SHARE_DIVISOR * (time.perf_counter() - read_started))
            item.due_s = now_s + interval
        self._writer.write(rec)
        self._samples += 1
        cost = time.thread_time_ns() - started
        self._cost_ns_total += cost
        self._cost_ns_max = max(self._cost_ns_max, cost)
        return rec

    def stop(self) -> dict[str, Any]:
        """Stops the thread, reads the kernel's own peak counters and returns the summary.

        On cgroup v1 the group's peak was reset at start, so `cgroup_peak_bytes` covers this
        run (everything in the group, the supervisor included)."""
        if self._summary is not None:
            return self._summary
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            if self._error is None:
                for item in self._schedule:  # a last line with every source: counters end complete
                    item.due_s = 0.0
                self.sample_once()
            self._stopped_ns = time.monotonic_ns()
            self._writer.close()
        for close in self._closers:
            close()
        self._summary = self._summarise()
        return self._summary

    def readings(self) -> dict[str, Any]:
        """Where the raw readings come from (meta.json `readings`, edgebench.figures.readings)."""
        out: dict[str, Any] = {"recorded_by": "python", "clock_ticks": cpu.CLOCK_TICKS,
                               "temperatures": {k: v for t in self._temperatures for k, v in t.names().items()}}
        if self._cgroup is not None:
            out["memory_cgroup"] = {"path": f"{self._cgroup.version}:{self._cgroup.dir}",
                                    "peak_scope": self._cgroup_peak_scope}
        if self._cgroup_cpu is not None:
            out["cgroup_cpu"] = self._cgroup_cpu.readings()
        source = self._power_source
        if isinstance(source, power.BatteryPower):
            out["battery"] = source.readings()
        elif source is not None:
            out["rails"] = source.readings()
        return out

    def _summarise(self) -> dict[str, Any]:
        duration_s = (self._stopped_ns - self._started_ns) / 1e9
        return {
            "samples": self._samples,
            "rate_hz": self.rate_hz,
            "achieved_hz": round(self._samples / duration_s, 2) if duration_s > 0 else None,
            "duration_s": round(duration_s, 3),
            "sample_cpu_us_mean": round(self._cost_ns_total / self._samples / 1e3, 1) if self._samples else None,
            "sample_cpu_us_max": round(self._cost_ns_max / 1e3, 1) if self._samples else None,
            "sources_active": [n for n in self._active if n not in self._failed],
            "sources_unavailable": dict(self._unavailable),
            "sources_failed": dict(self._failed),
            "sampler_error": self._error,
            "power_source": self._power_source.name if self._power_source is not None else None,
            "cgroup_status": "active" if self._cgroup is not None else
            self._unavailable.get("cgroup_memory") or self._failed.get("cgroup_memory"),
            "oom_kills_start": self._cgroup_start.get("cgroup_oom_kills"),
            "oom_kills_end": self._cgroup.counters().get("cgroup_oom_kills") if self._cgroup is not None else None,
        }
