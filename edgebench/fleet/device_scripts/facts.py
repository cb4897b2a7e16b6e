"""Facts deploy's preflight checks on a device: python, arch (and whether it is emulated: the
arm64 lab's python says so in EDGEBENCH_EMULATOR), libraries (found without importing them),
memory, cgroup limit, disk.

Runs on the device with `python -c` before edgebench is shipped: standard library only.
Usage: facts.py WORKDIR (prints one JSON object).
"""

import importlib.metadata as md
import importlib.util as iu
import json
import os
import platform
import shutil
import sys


def version(*dists):
    """The installed version of the first distribution found, or None."""
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    return None


def installed(module, *dists):
    return version(*dists) if iu.find_spec(module) else None


def meminfo():
    mem = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, value = line.split(":", 1)
            mem[key] = int(value.split()[0]) * 1024
    return mem


def cgroup_memory():
    """(limit, usage) of this process's memory cgroup, v1 or v2; (None, None) without a limit."""
    limit = usage = None
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        base = "/sys/fs/cgroup/memory" + path if "memory" in controllers.split(",") else "/sys/fs/cgroup" + path
        for lim, use in (("memory.limit_in_bytes", "memory.usage_in_bytes"), ("memory.max", "memory.current")):
            try:
                text = open(os.path.join(base, lim)).read().strip()
                if text != "max" and int(text) < 1 << 60:
                    limit, usage = int(text), int(open(os.path.join(base, use)).read())
            except (OSError, ValueError):
                pass
    return limit, usage


def main(workdir):
    workdir = os.path.abspath(os.path.expanduser(workdir))
    os.makedirs(workdir, exist_ok=True)
    mem = meminfo()
    limit, usage = cgroup_memory()
    return {
        "python": list(sys.version_info[:3]), "executable": sys.executable, "arch": platform.machine(),
        "emulated": bool(os.environ.get("EDGEBENCH_EMULATOR")), "emulator": os.environ.get("EDGEBENCH_EMULATOR"),
        "torch": installed("torch", "torch"),
        "executorch": installed("executorch", "executorch"),
        "onnxruntime_training": installed("onnxruntime", "onnxruntime-training-cpu", "onnxruntime-training"),
        "psutil": installed("psutil", "psutil"),
        "numpy": installed("numpy", "numpy"),
        "mem_available_bytes": mem.get("MemAvailable"), "mem_total_bytes": mem.get("MemTotal"),
        "cgroup_limit_bytes": limit, "cgroup_usage_bytes": usage,
        "disk_free_bytes": shutil.disk_usage(workdir).free, "workdir": workdir,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
