"""Small readers shared by the sensor modules: files under a root, and device commands.

Every sensor reads through these so tests can point it at a fixture tree shaped like a
real device's /proc and /sys, and feed it recorded command output through `runner`.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from edgebench.errors import EdgebenchError

# A command runner takes argv and returns its stdout; it raises OSError (not installed)
# or subprocess.SubprocessError (failed, timed out) when the command cannot answer.
Runner = Callable[[Sequence[str]], str]

HWMON_DIRS = ("/sys/class/hwmon/hwmon*", "/sys/bus/i2c/devices/*/hwmon/hwmon*")
# JetPack 4 and older (Nano, TX1/TX2, Xavier on L4T 32) expose the INA3221 through NVIDIA's
# `ina3221x` IIO driver instead of hwmon.
IIO_DIRS = ("/sys/bus/i2c/drivers/ina3221x/*/iio:device*", "/sys/bus/i2c/devices/*/iio:device*")


class SourceUnavailable(EdgebenchError):
    """A sensor source that this host does not have; the message says why."""


class ProfileMismatch(EdgebenchError, ValueError):
    """The profile names sensors this board does not report, or a sensors setting no board has;
    the message lists what it does report (or the settings there are), so the profile can be fixed."""


def run_command(argv: Sequence[str], timeout_s: float = 2.0) -> str:
    """The default runner: runs argv here and returns stdout (raises on failure)."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=True).stdout


def under(root: str | Path, path: str) -> Path:
    """`path` (absolute on the device) inside `root`."""
    return Path(root) / path.lstrip("/")


def read_text(path: str | Path) -> str | None:
    """The stripped content of a file, or None when it is missing or unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def read_int(path: str | Path) -> int | None:
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def key_name(text: str) -> str:
    """A label made fit for a flat JSON key: `VDD_CPU_GPU_CV` -> `vdd_cpu_gpu_cv`."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_") or "unnamed"


def unique_names(names: Sequence[str]) -> list[str]:
    """Keeps names unique by suffixing repeats (`cpu`, `cpu_2`), order kept."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def hwmon_dirs(root: str | Path) -> list[Path]:
    """Every hwmon device directory once (class links and i2c paths can name the same one)."""
    return unique_dirs(root, HWMON_DIRS)


def iio_dirs(root: str | Path) -> list[Path]:
    """Every INA3221 IIO device directory (`ina3221x` driver) once."""
    return unique_dirs(root, IIO_DIRS)


def unique_dirs(root: str | Path, patterns: Sequence[str]) -> list[Path]:
    """Directories matching any pattern under root, each real directory once: sysfs reaches
    one device through several symlinks (/sys/class, /sys/bus/*/devices, drivers)."""
    seen, out = set(), []
    for pattern in patterns:
        for path in sorted(Path(root).glob(pattern.lstrip("/"))):
            real = path.resolve()
            if real not in seen:
                seen.add(real)
                out.append(path)
    return out


class PreadFile:
    """A /proc or /sys file kept open and re-read with pread at offset 0.

    Both seq_file (/proc) and sysfs regenerate their content on a read at offset 0, so
    this saves an open and a close per read; that is most of the cost of a sample.
    """

    def __init__(self, path: str | Path, size: int = 4096):
        self.path = str(path)
        self._size = size
        self._fd: int | None = None

    def read(self) -> str | None:
        """The stripped content, or None when the file is gone or unreadable (e.g. the process exited)."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            return os.pread(self._fd, self._size, 0).decode("ascii", "replace").strip()
        except OSError:
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
