"""Facts deploy's preflight checks on a device: python, arch (and whether it is emulated: the
arm64 lab's python says so in EDGEBENCH_EMULATOR), libraries (found without importing them),
memory, cgroup limit (its usage and page cache), disk.

Runs on the device with `python -c` before edgebench is shipped: standard library only.
Usage: facts.py WORKDIR [ROOT] (prints one JSON object). /proc and /sys are read under ROOT
(`/` on a device; a fixture tree in tests). facts.sh is its twin for a device with no Python.
"""

import importlib.metadata as md
import importlib.util as iu
import json
import os
import platform
import shutil
import sys
from typing import Any


def version(*dists: str) -> str | None:
    """The installed version of the first distribution found, or None."""
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    return None


def installed(module: str, *dists: str) -> str | None:
    return version(*dists) if iu.find_spec(module) else None


def under(root: str, path: str) -> str:
    """`path` (absolute on the device) inside `root`."""
    return os.path.join(root, path.lstrip("/"))


def meminfo(root: str = "/") -> dict[str, int]:
    mem = {}
    with open(under(root, "/proc/meminfo")) as fh:
        for line in fh:
            key, value = line.split(":", 1)
            mem[key] = int(value.split()[0]) * 1024
    return mem


def page_cache(stat_file: str) -> int | None:
    """The cgroup's file-backed page cache (memory.stat), which the kernel reclaims before it
    refuses a new run: its inactive + active file pages (v1 `total_*`, v2 plain; not tmpfs, which
    sits on the anon lists: the lab's stand-in for a board's OS is held there), else v1's
    total_cache or v2's file."""
    try:
        with open(stat_file) as fh:
            fields = [line.split() for line in fh]
    except OSError:
        return None
    numbers = {f[0]: int(f[1]) for f in fields if len(f) >= 2 and f[1].isdigit()}
    v1 = "total_cache" in numbers
    prefix = "total_" if v1 else ""
    if f"{prefix}inactive_file" in numbers and f"{prefix}active_file" in numbers:
        return numbers[f"{prefix}inactive_file"] + numbers[f"{prefix}active_file"]
    return numbers["total_cache"] if v1 else numbers.get("file")


def cgroup_memory(root: str = "/") -> tuple[int | None, int | None, int | None]:
    """(limit, usage, page cache) of this process's memory cgroup, v1 or v2; all None without a limit."""
    limit: int | None = None
    usage: int | None = None
    cache: int | None = None
    for line in open(under(root, "/proc/self/cgroup")):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        v1 = "memory" in controllers.split(",")
        base = under(root, ("/sys/fs/cgroup/memory" if v1 else "/sys/fs/cgroup") + path)
        for lim, use in (("memory.limit_in_bytes", "memory.usage_in_bytes"), ("memory.max", "memory.current")):
            try:
                text = open(os.path.join(base, lim)).read().strip()
                if text != "max" and int(text) < 1 << 60:
                    limit, usage = int(text), int(open(os.path.join(base, use)).read())
                    cache = page_cache(os.path.join(base, "memory.stat"))
            except (OSError, ValueError):
                pass
    return limit, usage, cache


def main(workdir: str, root: str = "/") -> dict[str, Any]:
    workdir = os.path.abspath(os.path.expanduser(workdir))
    os.makedirs(workdir, exist_ok=True)
    mem = meminfo(root)
    limit, usage, cache = cgroup_memory(root)
    emulator = os.environ.get("EDGEBENCH_EMULATOR") or None
    return {
        "python": list(sys.version_info[:3]), "executable": sys.executable, "arch": platform.machine(),
        "emulated": emulator is not None, "emulator": emulator,
        "torch": installed("torch", "torch"),
        "executorch": installed("executorch", "executorch"),
        "onnxruntime_training": installed("onnxruntime", "onnxruntime-training-cpu", "onnxruntime-training"),
        "psutil": installed("psutil", "psutil"),
        "numpy": installed("numpy", "numpy"),
        "mem_available_bytes": mem.get("MemAvailable"), "mem_total_bytes": mem.get("MemTotal"),
        "cgroup_limit_bytes": limit, "cgroup_usage_bytes": usage, "cgroup_cache_bytes": cache,
        "disk_free_bytes": shutil.disk_usage(workdir).free, "workdir": workdir,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:3])))
