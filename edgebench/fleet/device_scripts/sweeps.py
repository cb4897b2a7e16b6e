"""Each sweep's state and whether its process is still alive, for `edgebench status`.

Runs on the device with `python -c`: standard library only.
Usage: sweeps.py WORKDIR (prints one JSON object).
"""

import json
import os
import sys


def alive(pid_file):
    try:
        pid = int(open(pid_file).read())
        os.kill(pid, 0)
        return open("/proc/%d/stat" % pid).read().split()[2] != "Z"
    except (OSError, ValueError):
        return False


def main(workdir):
    root = os.path.join(os.path.abspath(os.path.expanduser(workdir)), "sweeps")
    out = {}
    for sweep in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        sdir = os.path.join(root, sweep)
        try:
            with open(os.path.join(sdir, "sweep.json")) as fh:
                state = json.load(fh)
        except (OSError, ValueError):
            state = {}
        specs = sorted(f[:-5] for f in os.listdir(os.path.join(sdir, "specs")) if f.endswith(".json"))
        out[sweep] = {"alive": alive(os.path.join(sdir, "sweep.pid")), "state": state.get("state"),
                      "runs": state.get("runs", {}), "specs": specs}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
