"""Each sweep's state as it really is, for `edgebench status`.

A sweep whose process is gone but whose sweep.json still says `running` was stopped from
outside (killed, its device rebooted, its disk filled up): it reads `stopped`, with why
when sweep.log tells, and its unfinished runs read `stopped` too. Never `running` without
a live sweep process.

Runs on the device with `python -c`: standard library only.
Usage: sweeps.py WORKDIR (prints one JSON object).
"""

import json
import os
import sys

CLUES = (("no space left", "the disk filled up (no space left on device)"),
         ("memoryerror", "the sweep ran out of memory"),
         ("killed", "the sweep process was killed"),
         ("traceback", "the sweep process crashed (see sweep.log)"))


def alive(pid_file):
    """Whether the pid in the file is a live sweep process (not a zombie, not a reused pid)."""
    try:
        pid = int(open(pid_file).read())
        os.kill(pid, 0)
        if open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        return b"edgebench.runner.sweep" in open("/proc/%d/cmdline" % pid, "rb").read()
    except (OSError, ValueError, IndexError):
        return False


def why_stopped(sdir):
    """What sweep.log's tail says about the end, or a plain statement."""
    try:
        with open(os.path.join(sdir, "sweep.log"), "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            tail = fh.read().decode("utf-8", "replace").lower()
    except OSError:
        tail = ""
    for clue, why in CLUES:
        if clue in tail:
            return why
    return "the sweep process is gone before it finished (killed, or the device restarted)"


def sweep_state(sdir):
    try:
        with open(os.path.join(sdir, "sweep.json")) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        state = {}
    try:
        specs = sorted(f[:-5] for f in os.listdir(os.path.join(sdir, "specs")) if f.endswith(".json"))
    except OSError:
        specs = []
    is_alive = alive(os.path.join(sdir, "sweep.pid"))
    recorded = state.get("state")
    runs = dict(state.get("runs", {}))
    why = state.get("why")
    if is_alive:
        shown = "running"
    elif recorded in (None, "running"):
        shown = "stopped" if recorded or os.path.exists(os.path.join(sdir, "sweep.pid")) else "not started"
        if shown == "stopped":
            why = why or why_stopped(sdir)
            runs = {rid: ("stopped" if s == "running" else s) for rid, s in runs.items()}
    else:
        shown = recorded
    return {"alive": is_alive, "state": shown, "why": why, "runs": runs, "specs": specs}


def main(workdir):
    root = os.path.join(os.path.abspath(os.path.expanduser(workdir)), "sweeps")
    out = {}
    for sweep in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        out[sweep] = sweep_state(os.path.join(root, sweep))
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
