"""Small stand-alone Python programs the host runs on a device with `python -c`.

They use only the standard library, so they work before edgebench is shipped and on a
device where torch is missing (that is what preflight reports). Each prints one JSON
object. `remote_python(device, program, *args)` builds the argv.
"""

from __future__ import annotations

import json
from typing import Any

from edgebench.devices.inventory import Device
from edgebench.devices.transport import Transport, TransportError

# Facts preflight checks: python, arch, libraries (found without importing them), memory, disk.
FACTS = r"""
import importlib.metadata as md, importlib.util as iu, json, os, platform, shutil, sys
workdir = os.path.abspath(os.path.expanduser(sys.argv[1]))
os.makedirs(workdir, exist_ok=True)
def version(*dists):
    for d in dists:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            pass
    return None
mem = {}
with open("/proc/meminfo") as fh:
    for line in fh:
        key, value = line.split(":", 1)
        mem[key] = int(value.split()[0]) * 1024
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
print(json.dumps({
    "python": list(sys.version_info[:3]), "executable": sys.executable, "arch": platform.machine(),
    "torch": version("torch") if iu.find_spec("torch") else None,
    "executorch": version("executorch") if iu.find_spec("executorch") else None,
    "onnxruntime_training": version("onnxruntime-training-cpu", "onnxruntime-training")
        if iu.find_spec("onnxruntime") else None,
    "psutil": version("psutil") if iu.find_spec("psutil") else None,
    "numpy": version("numpy") if iu.find_spec("numpy") else None,
    "mem_available_bytes": mem.get("MemAvailable"), "mem_total_bytes": mem.get("MemTotal"),
    "cgroup_limit_bytes": limit, "cgroup_usage_bytes": usage, "disk_free_bytes": shutil.disk_usage(workdir).free,
    "workdir": workdir,
}))
"""

# Every file under WORKDIR/sweeps/*/runs/*/ and each sweep.json, with size and sha256.
MANIFEST = r"""
import hashlib, json, os, sys
root = os.path.join(os.path.abspath(os.path.expanduser(sys.argv[1])), "sweeps")
def digest(path):
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}
out = {"root": root, "sweeps": {}}
for sweep in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    sdir = os.path.join(root, sweep)
    entry = {"state": None, "runs": {}}
    try:
        with open(os.path.join(sdir, "sweep.json")) as fh:
            entry["state"] = json.load(fh)
    except (OSError, ValueError):
        pass
    runs = os.path.join(sdir, "runs")
    for run in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        files = {}
        for name in sorted(os.listdir(os.path.join(runs, run))):
            path = os.path.join(runs, run, name)
            if os.path.isfile(path) and not name.endswith(".tmp"):
                files[name] = digest(path)
        entry["runs"][run] = files
    out["sweeps"][sweep] = entry
print(json.dumps(out))
"""

# Each sweep's state and whether its process is still alive.
STATUS = r"""
import json, os, sys
root = os.path.join(os.path.abspath(os.path.expanduser(sys.argv[1])), "sweeps")
out = {}
for sweep in sorted(os.listdir(root)) if os.path.isdir(root) else []:
    sdir = os.path.join(root, sweep)
    try:
        with open(os.path.join(sdir, "sweep.json")) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        state = {}
    try:
        pid = int(open(os.path.join(sdir, "sweep.pid")).read())
        os.kill(pid, 0)
        alive = open("/proc/%d/stat" % pid).read().split()[2] != "Z"
    except (OSError, ValueError):
        alive = False
    specs = sorted(f[:-5] for f in os.listdir(os.path.join(sdir, "specs")) if f.endswith(".json"))
    out[sweep] = {"alive": alive, "state": state.get("state"), "runs": state.get("runs", {}), "specs": specs}
print(json.dumps(out))
"""


def run_program(transport: Transport, device: Device, program: str, *args: str, timeout: float = 120) -> Any:
    """Runs one of the programs above with the device's python; returns its JSON."""
    result = transport.run([device.python, "-c", program, *args], timeout=timeout)
    if result.rc in (126, 127) or (result.rc != 0 and "not found" in result.stderr):
        raise TransportError(
            f"{device.name}: python {device.python!r} cannot be run on the device ({result.stderr.strip()[-300:]}); "
            f"install Python 3.10+ there or set `python:` in the inventory entry (or the profile). Over adb the "
            f"`shell` user cannot run Termux's python: use SSH into Termux instead (see device_profiles/pixel-8.yaml)"
        )
    if result.rc != 0:
        raise TransportError(f"{device.name}: remote helper failed (exit {result.rc}): {result.stderr.strip()[-1500:]}")
    return json.loads(result.stdout)
