"""Is a device ready to run sweeps? Each missing piece with the exact command that fixes it.

`check(device)` probes the board (detect.PROBE: memory, disk, sensors, clock) and its Python
(pylibs.py: version, torch and its build, ExecuTorch, ONNX Runtime training where the arch
has a wheel) and returns findings. `missing` ones stop a deploy; `warn` ones cost figures
(power falls back to estimates, timelines align less well). The safe fixes are pip installs
into a venv in the device's work directory; `fix()` runs them.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebench.devices import detect, pylibs
from edgebench.devices.inventory import Device, edited_inventory, inventory_path
from edgebench.devices.transport import Transport, TransportError
from edgebench.telemetry.power import POWER_SOURCES

if TYPE_CHECKING:
    from edgebench.runner.spec import RunSpec

MIN_PYTHON = (3, 10)
TORCH = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
JETSON_TORCH_DOCS = "https://docs.nvidia.com/deeplearning/frameworks/install-pytorch-jetson-platform/index.html"
DISK_LOW = 2 * 2**30  # a CPU torch install plus a few sweeps' traces
DISK_MIN = 200 * 2**20
CLOCK_TOLERANCE_S = 2.0

# What fixes each piece, per board family (linux: anything else, x86_64 and the lab included).
# A list is a pip requirement: safe, `--fix` installs it into the device's venv. A string is a
# command the user runs (it needs sudo, another package manager, or a choice only they can make).
FIXES: dict[str, dict[str, list[str] | str]] = {
    "python": {"linux": "sudo apt-get install -y python3 python3-venv", "termux": "pkg install python"},
    "venv-module": {"linux": "sudo apt-get install -y python3-venv", "termux": "pkg install python"},
    # PyPI's torch is a CUDA build on x86_64 and aarch64 (GBs of CUDA libraries); the CPU build
    # is on PyTorch's own index. Jetsons need NVIDIA's CUDA build for their JetPack.
    "torch": {"linux": [f"torch=={TORCH}", "--index-url", TORCH_CPU_INDEX],
              "jetson": f"install NVIDIA's PyTorch wheel for this JetPack ({JETSON_TORCH_DOCS}); without the GPU: "
                        f"pip install torch=={TORCH} --index-url {TORCH_CPU_INDEX}",
              "termux": "pkg install python-torch"},
    "torch-cuda-on-cpu-board": {"linux": ["--force-reinstall", f"torch=={TORCH}", "--index-url", TORCH_CPU_INDEX]},
    "numpy": {"linux": ["numpy"], "termux": "pkg install python-numpy"},
    "psutil": {"linux": ["psutil"]},
    "executorch": {"linux": ["executorch==1.5.1"],
                   "termux": "no ExecuTorch wheel for Android's Python; use --backend eager there"},
    "onnxruntime": {"linux": ["onnxruntime-training-cpu==1.19.2"]},
    "vcgencmd": {"pi": "sudo apt-get install -y raspi-utils && sudo usermod -aG video $USER  # then log in again"},
    "jtop": {"jetson": "sudo pip3 install -U jetson-stats && sudo systemctl restart jtop.service"},
    "rapl": {"linux": "sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj  # root-only since Linux 5.10"},
    "clock": {"linux": "sudo timedatectl set-ntp true",
              "termux": "Android Settings > System > Date & time > Set time automatically"},
}

ADB_LIMITS = ("over adb edgebench checks the battery, thermal zones, disk, clock and Android version, not Python or "
              "its libraries: adb's shell user cannot run Termux's python. Add the phone over SSH into Termux "
              "(`pkg install openssh python`, `sshd`, port 8022) to check those")


@dataclass
class Finding:
    """One piece: status ok | missing (stops a deploy) | warn | n/a | unknown (cannot be checked)."""

    item: str
    status: str
    detail: str
    fix: str | None = None  # the exact command (or step) that fixes it on this board
    pip: list[str] | None = None  # set when the fix is a safe pip install into the venv

    def line(self) -> str:
        return f"{self.item}: {self.detail}" + (f"; fix: `{self.fix}`" if self.fix else "")


@dataclass
class Readiness:
    device: str
    findings: list[Finding] = field(default_factory=list)
    facts: detect.BoardFacts | None = None
    venv_python: str | None = None  # where --fix installs

    @property
    def reachable(self) -> bool:
        return not any(f.item == "reachable" for f in self.findings)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "missing"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "warn"]

    @property
    def ready(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if not self.reachable:
            return "unreachable"
        problems, warnings = len(self.problems), len(self.warnings)
        if problems:
            return f"{problems} problem{'s' * (problems > 1)}"
        return "ready" + (f" ({warnings} warning{'s' * (warnings > 1)})" if warnings else "")

    def messages(self) -> list[str]:
        """The problems as one line each, with the fix: what deploy's preflight prints."""
        return [f.line() for f in self.problems]

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "summary": self.summary(), "ready": self.ready,
                "findings": [vars(f) for f in self.findings]}


def family(device: Device, facts: detect.BoardFacts | None = None) -> str:
    """The board family that picks fixes: pi | jetson | termux | adb | linux."""
    if device.transport.kind == "adb":
        return "adb"
    pid = device.profile.id
    if (facts is not None and facts.termux) or pid.startswith("pixel") or "termux" in device.python:
        return "termux"
    if pid.startswith("raspberry-pi"):
        return "pi"
    if pid.startswith("jetson") or (facts is not None and facts.l4t):
        return "jetson"
    return "linux"


def _fix(piece: str, board: str) -> list[str] | str | None:
    table = FIXES.get(piece, {})
    return table.get(board, table.get("linux")) if board != "adb" else None


class _Checker:
    """Builds findings for one device from its probe and Python facts."""

    def __init__(self, device: Device, facts: detect.BoardFacts, backends: set[str]):
        self.device, self.facts, self.backends = device, facts, backends
        self.board = family(device, facts)
        self.venv_python = f"{facts.workdir or device.workdir}/venv/bin/python"
        self.findings: list[Finding] = []

    def add(self, item: str, status: str, detail: str, piece: str | None = None) -> None:
        fix = _fix(piece, self.board) if piece and status != "ok" else None
        if isinstance(fix, list):
            self.findings.append(Finding(item, status, detail,
                                         shlex.join([self.venv_python, "-m", "pip", "install", *fix]), fix))
        else:
            self.findings.append(Finding(item, status, detail, fix))

    def python(self, libs: dict[str, Any] | None, error: str | None) -> None:
        d = self.device
        if self.board == "adb":
            self.add("python", "unknown", ADB_LIMITS)
            return
        if libs is None:
            others = [(p, v) for asked, p, v in self.facts.pythons if asked != d.python]
            detail = f"{d.python} does not run on the device ({error})"
            if others:  # another one does: point the entry at it
                self.findings.append(Finding("python", "missing", f"{detail}; {others[0][0]} ({others[0][1]}) runs",
                                             f"set python: {others[0][0]} in the inventory entry"))
            else:
                self.add("python", "missing", detail, "python")
            return
        version = tuple(libs["python"])
        status = "ok" if version >= MIN_PYTHON else "missing"
        self.add("python", status, f"{'.'.join(map(str, version))} at {libs['executable']}"
                 + ("" if status == "ok" else " (3.10+ needed)"), "python")

    def no_python(self) -> None:
        """`python: none`: the shell sweep and the native worker need nothing installed."""
        others = sorted(self.backends - {NATIVE})
        detail = ("no Python on this device (`python: none`): runs go through the shell sweep with the native "
                  "ExecuTorch worker, which deploy builds for its arch and ships with its libraries")
        if others:
            self.findings.append(Finding("python", "missing", f"{detail}; {', '.join(others)} needs Python",
                                         "use --backend executorch --runtime native, or install Python 3.10+ and "
                                         "psutil and set python: in the inventory entry"))
        else:
            self.add("python", "n/a", detail)

    def libraries(self, libs: dict[str, Any]) -> None:
        # an emulated python (the arm64 lab) has another arch than the shell the probe ran in
        arch = (libs.get("emulator") and libs.get("machine")) or self.facts.arch or self.device.profile.arch
        # the ONNX Runtime runner and the native ExecuTorch worker are torch-free
        needs_torch = bool(self.backends - {"onnxruntime", NATIVE})
        cuda_board = "cuda" in self.device.profile.accelerators
        torch, cuda = libs["torch"], libs["torch_cuda"]
        if torch is None and self.backends == {NATIVE}:
            self.add("torch", "n/a", "not installed (not needed: the native ExecuTorch worker runs without it)")
        elif torch is None:
            self.add("torch", "missing" if needs_torch else "warn", "not installed", "torch")
        elif cuda and libs.get("emulator"):  # the arm64 lab: PyPI has no CPU aarch64 torch
            self.add("torch", "ok", f"{torch} (PyPI's CUDA {cuda} build with stub CUDA libraries: the emulated arm64 "
                     f"lab, {libs['emulator']}; a real board wants the CPU build)")
        elif cuda and not cuda_board and libs.get("cuda_runtime") is False:
            self.add("torch", "missing" if needs_torch else "warn", f"{torch} is a CUDA {cuda} build and no CUDA "
                     "runtime library is installed, so `import torch` fails; this board needs the CPU build",
                     "torch-cuda-on-cpu-board")
        elif cuda and not cuda_board:
            self.add("torch", "warn", f"{torch} is a CUDA {cuda} build (PyPI's default): gigabytes of CUDA libraries "
                     "this board cannot use; the CPU build is on PyTorch's CPU index", "torch-cuda-on-cpu-board")
        elif cuda_board and not cuda:
            self.add("torch", "warn", f"{torch} is a CPU build: the board's GPU stays unused", "torch")
        else:
            self.add("torch", "ok", f"{torch} ({f'CUDA {cuda}' if cuda else 'CPU'} build)")
        for lib in ("numpy", "psutil"):
            needed = lib == "psutil" or bool(self.backends - {NATIVE})  # the supervisor needs psutil only
            self.add(lib, "ok" if libs[lib] else ("missing" if needed else "warn"),
                     libs[lib] or "not installed" + ("" if needed else " (not needed by the native worker)"), lib)
        et = libs["executorch"]
        if not et and self.backends == {NATIVE}:
            self.add("executorch", "n/a", "not installed (not needed: the native worker carries its own runtime)")
        else:
            self.add("executorch", "ok" if et else ("missing" if "executorch" in self.backends else "warn"),
                     et or "not installed (needed for --backend executorch --runtime python)", "executorch")
        from edgebench.backends.support import device_reason

        no_wheel = device_reason("onnxruntime", arch, device="this board")
        ort = libs["onnxruntime_training"]
        if no_wheel:
            self.add("onnxruntime", "n/a", no_wheel)
        else:
            self.add("onnxruntime", "ok" if ort else ("missing" if "onnxruntime" in self.backends else "warn"),
                     ort or "onnxruntime-training not installed (needed for --backend onnxruntime)", "onnxruntime")

    def venv(self, libs: dict[str, Any] | None) -> None:
        """The venv --fix installs into, when a safe fix needs it and it is not the python in use."""
        if not any(f.pip for f in self.findings) or self.device.python == self.venv_python:
            return
        if libs is not None and libs.get("emulator"):  # the arm64 lab's root is rebuilt, never pip-installed into
            return
        if libs is not None and not libs["venv_module"]:
            self.add("venv", "missing", f"{self.device.python} has no venv module, so --fix cannot make "
                     f"{self.venv_python}", "venv-module")
            return
        self.findings.append(
            Finding(
                "venv",
                "n/a",
                f"--fix first makes this venv; pip installs go there and the inventory's python then "
                f"points at {self.venv_python}",
                shlex.join(
                    [
                        self.device.python,
                        "-m",
                        "venv",
                        "--system-site-packages",
                        self.venv_python[: -len("/bin/python")],
                    ]
                ),
                pip=[],
            )
        )

    def disk(self) -> None:
        free = self.facts.disk_free_bytes
        if free is None:
            self.add("disk", "unknown", f"free space of {self.device.workdir} not readable (df failed)")
            return
        status = "missing" if free < DISK_MIN else "warn" if free < DISK_LOW else "ok"
        detail = f"{free / 2**30:.1f} GiB free in {self.facts.workdir or self.device.workdir}"
        self.findings.append(Finding("disk", status, detail, None if status == "ok" else
                                     f"du -sh {self.facts.workdir}/sweeps/*  # remove sweeps already collected"))

    def memory(self) -> None:
        """The RAM a run meets there (`devices add`'s figure: a cgroup limit counts), what is free
        now, and whether the device's figure (its entry's, else its profile's) says the same."""
        f, profile = self.facts, self.device.profile
        if f.ram()[0] is None:
            self.add("memory", "unknown", f"{self.device.name}'s /proc/meminfo has no MemTotal")
            return
        if f.mem_available_bytes is None:
            self.add("memory", "warn", detect.no_mem_available(self.device.name))
            return
        detail = f"{detect.ram_words(f)}, {f.mem_available_bytes / 2**30:.1f} GiB available now (MemAvailable)"
        own = detect.board_figures(f, profile).get("ram_bytes")
        if own is None:
            self.add("memory", "ok", detail)
        else:  # an entry written before the cgroup counted, or a profile that is not this board's
            self.findings.append(Finding("memory", "warn", f"{detail}; predictions use {self.device.name}'s "
                                         f"{int(profile.ram_bytes) / 2**30:.1f} GiB",
                                         f"set ram_bytes: {own} in {self.device.name}'s entry of {inventory_path()}"))

    def sensors(self) -> None:
        f, sensors = self.facts, self.device.profile.sensors
        source = sensors.power.source
        # auto: the sources the probe found on the board, a readable one first (as the sampler takes them)
        present = [s for s in POWER_SOURCES if f.power.get(s)] if source == "auto" else [source]
        if source == "none" or not present:
            self.add("power", "n/a", "no power sensor on this board: power is "
                     + ("estimated (power_w_est)" if self.device.profile.power_model else "not measured"))
        else:  # what the probe found for the source, read by its descriptor (telemetry/power.py)
            readings = [(POWER_SOURCES[s], POWER_SOURCES[s].ready(f.power.get(s, []), sensors.power.model_dump()))
                        for s in present]
            described, (status, detail, needs_fix) = next((r for r in readings if r[1][0] == "ok"), readings[0])
            self.add("power", status, detail, described.fix if needs_fix else None)
        zones = sorted({name for name, temp in f.thermal if temp.strip() and temp.strip() != "-256000"})
        patterns = sensors.thermal_zones  # names or case-insensitive patterns; "*": all
        matched = [z for z in zones if any(fnmatch.fnmatch(z.lower(), p.lower()) for p in patterns)]
        unmatched = [p for p in patterns if not any(fnmatch.fnmatch(z.lower(), p.lower()) for z in zones)]
        if not patterns:
            self.add("thermal", "n/a", "the profile lists no thermal zones")
        elif patterns == ["*"] and not zones:
            self.add("thermal", "n/a", "no readable thermal zone on this board")
        elif matched and not unmatched:
            self.add("thermal", "ok", f"zones {', '.join(matched)} readable")
        else:
            self.add("thermal", "warn", f"no readable thermal zone matches {', '.join(unmatched)} (found: "
                     f"{', '.join(zones) or 'none'}); fix `sensors.thermal_zones` in a copy of the profile")
        if sensors.throttle == "vcgencmd":
            answer = f.vcgencmd or ""
            ok = answer.startswith("throttled=")
            self.add("throttle", "ok" if ok else "warn", answer if ok else
                     f"vcgencmd get_throttled does not answer ({f.vcgencmd or 'not installed'})", "vcgencmd")
        if self.board == "jetson":
            ok = f.jtop == "active" or f.jtop_socket
            self.add("jtop", "ok" if ok else "warn", "jtop service active" if ok else
                     f"jtop service not running ({f.jtop or 'no systemd'}): GPU load and the fallback power "
                     "reader need it", "jtop")

    def clock(self) -> None:
        f = self.facts
        if f.clock_offset_s is None:
            self.add("clock", "unknown", "the device's date did not answer")
            return
        off = abs(f.clock_offset_s) - (f.clock_uncertainty_s or 0)
        ntp = {"yes": "NTP synchronised", "no": "NTP NOT synchronised"}.get(f.ntp, "NTP status not reported")
        detail = f"{f.clock_offset_s:+.2f} s from this host (±{f.clock_uncertainty_s:.2f}), {ntp}"
        self.add("clock", "warn" if off > CLOCK_TOLERANCE_S or f.ntp == "no" else "ok", detail, "clock")


def _python_libs(transport: Transport, device: Device) -> tuple[dict[str, Any] | None, str | None]:
    result = transport.run([device.python, "-c", Path(pylibs.__file__).read_text()], timeout=120)
    if result.rc != 0:
        return None, (result.stderr.strip().splitlines() or [f"exit {result.rc}"])[-1][-300:]
    try:  # the last line: a login script may print before it
        return json.loads((result.stdout.strip().splitlines() or [""])[-1]), None
    except ValueError:
        return None, f"unexpected output {result.stdout.strip()[-200:]!r}"


NATIVE = "executorch-native"  # what a run of the native ExecuTorch worker needs: no torch, no executorch wheel


def need(spec: RunSpec) -> str:
    """What a spec asks of the device: its backend, or NATIVE for the native ExecuTorch worker."""
    return NATIVE if spec.backend == "executorch" and spec.runtime == "native" else spec.backend


def _runs_there(device: Device) -> set[str]:
    """What a check requires unless asked: the profile's backends; on a device without Python the
    native worker in place of its executorch, the one run that can go there, so a fresh such device
    is ready (deploy's preflight still refuses a Python run there, asked for by name)."""
    profile = set(device.profile.backends)
    return {NATIVE} if not device.has_python and "executorch" in profile else profile


def check(device: Device, transport: Transport | None = None, backends: Iterable[str] | None = None) -> Readiness:
    """Every finding for the device; `backends` (default: _runs_there) decide what is required.

    Never raises for an unreachable device: that is a finding with the fix.
    """
    from edgebench.devices import connect

    wanted = set(backends if backends is not None else _runs_there(device))
    readiness = Readiness(device.name)
    try:
        own = transport is None
        transport = transport or connect(device)
    except TransportError as exc:
        readiness.findings.append(Finding("reachable", "missing", str(exc)))
        if device.transport.kind == "adb":
            readiness.findings.append(Finding("adb", "n/a", ADB_LIMITS))
        return readiness
    try:
        facts = detect.probe(transport, device)
        checker = _Checker(device, facts, wanted)
        if device.has_python:
            libs, error = (None, None) if checker.board == "adb" else _python_libs(transport, device)
            checker.python(libs, error)
            if libs is not None:
                checker.libraries(libs)
            checker.venv(libs)
        else:
            checker.no_python()
        checker.disk()
        checker.memory()
        checker.sensors()
        checker.clock()
    except TransportError as exc:
        readiness.findings.append(Finding("reachable", "missing", str(exc)))
        return readiness
    finally:
        if own:
            transport.close()
    readiness.findings, readiness.facts, readiness.venv_python = checker.findings, facts, checker.venv_python
    return readiness


@dataclass
class FixResult:
    item: str
    command: str
    ok: bool
    output: str


def fix_plan(readiness: Readiness, only: Iterable[str] | None = None) -> list[Finding]:
    """The safe fixes `fix` would run, the venv first; empty when no pip install is wanted."""
    chosen = set(only) if only else None
    todo = sorted((f for f in readiness.findings if f.pip is not None and f.status != "ok"
                   and (chosen is None or f.item in chosen or f.item == "venv")), key=lambda f: f.item != "venv")
    return todo if any(f.pip for f in todo) else []


def fix(device: Device, readiness: Readiness, only: Iterable[str] | None = None,
        step: Callable[[str], None] = lambda _: None) -> list[FixResult]:
    """Runs the safe fixes (venv, then pip installs into it) and points the inventory entry's
    `python:` at the venv. `only` limits them to these items; `step` hears each command first."""
    from edgebench.devices import connect

    todo = fix_plan(readiness, only)
    if not todo:
        return []
    results: list[FixResult] = []
    with connect(device) as transport:
        for finding in todo:
            step(finding.fix or finding.item)
            argv = shlex.split(finding.fix or "")
            try:
                result = transport.run(argv, timeout=3600)
                ok, output = result.rc == 0, (result.stdout + result.stderr).strip()[-2000:]
            except TransportError as exc:
                ok, output = False, str(exc)
            results.append(FixResult(finding.item, finding.fix or "", ok, output))
            if finding.item == "venv" and not ok:
                break  # nothing can be installed without it
    venv = readiness.venv_python
    if venv and device.python != venv and any(r.ok for r in results if r.item == "venv"):
        with edited_inventory() as entries:
            if device.name in entries:
                entries[device.name] = {**entries[device.name], "python": venv}
    return results
