"""Every file under WORKDIR/sweeps/*/runs/*/ (and its weights/ folder) with size and sha256, and each sweep.json
and host.json (the host that started the sweep: fleet.deploy writes it), so
`edgebench collect` fetches only what changed and verifies what it fetched. Hidden files
(the runner's disk reserve) and folders, and half-written `.tmp` files are left out.
listing.sh is its twin for a device with no Python.

Runs on the device with `python -c`: standard library only.
Usage: listing.py WORKDIR (prints one JSON object).
"""

import hashlib
import json
import os
import sys
from typing import Any


def digest(path: str) -> dict[str, Any]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return {"size": size, "sha256": h.hexdigest()}


def listdir(path: str) -> list[str]:
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def json_object(path: str) -> dict[str, Any] | None:
    """The JSON object in the file, or None (as listing.sh: an object or null)."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folders(path: str) -> list[str]:
    """The folders in path, hidden ones left out (as a shell's `*` does)."""
    return [name for name in listdir(path) if not name.startswith(".") and os.path.isdir(os.path.join(path, name))]


def main(workdir: str) -> dict[str, Any]:
    root = os.path.join(os.path.abspath(os.path.expanduser(workdir)), "sweeps")
    sweeps: dict[str, Any] = {}
    out = {"root": root, "sweeps": sweeps}
    for sweep in folders(root):
        sdir = os.path.join(root, sweep)
        runs_files: dict[str, dict[str, dict[str, Any]]] = {}
        entry: dict[str, Any] = {"state": json_object(os.path.join(sdir, "sweep.json")),
                                 "host": json_object(os.path.join(sdir, "host.json")), "runs": runs_files}
        runs = os.path.join(sdir, "runs")
        for run in folders(runs):
            files: dict[str, dict[str, Any]] = {}
            rdir = os.path.join(runs, run)
            # the run's own files, and the trained weights a --save run keeps in weights/
            names = listdir(rdir) + ["weights/" + name for name in listdir(os.path.join(rdir, "weights"))]
            for name in names:
                path = os.path.join(rdir, name)
                base = os.path.basename(name)
                if os.path.isfile(path) and not base.endswith(".tmp") and not base.startswith("."):
                    files[name] = digest(path)
            runs_files[run] = files
        sweeps[sweep] = entry
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
