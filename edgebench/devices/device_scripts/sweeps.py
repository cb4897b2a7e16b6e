"""Each sweep's state as it really is, for `edgebench status`, and which host started it (host.json).

A sweep whose process is gone but whose sweep.json still says `running` was stopped from
outside (killed, its device rebooted, its disk filled up): it reads `stopped`, with why
when sweep.log tells. Never `running` without a live sweep process. Its record is made
final here (`finalize`, once no sweep process holds the directory's lock): the run it was
running gets a result.json (`killed`, with why; marked `cut_off`, so a restarted sweep runs
it again as a fresh attempt; or `oom` when the kernel counted an OOM kill during it) and
sweep.json says `stopped`, so status, collect and the store all read the same final status.

Runs on the device with `python -c`: standard library only.
Usage: sweeps.py WORKDIR (prints one JSON object). sweeps.sh is its twin for a device with no Python.
"""

import fcntl
import json
import os
import sys
from typing import Any

CLUES = (("no space left", "the disk filled up (no space left on device)"),
         ("memoryerror", "the sweep ran out of memory"),
         ("killed", "the sweep process was killed"),
         ("traceback", "the sweep process crashed (see sweep.log)"))


# What a sweep process's command line holds: runner/sweep.py's module, or runner/sweep.sh (a
# device with no Python) as fleet/shell_sweep.py starts it.
SWEEP_PROCESSES = (b"edgebench.runner.sweep", b"edgebench/runner/sweep.sh")


def alive(pid_file: str) -> bool:
    """Whether the pid in the file is a live sweep process (not a zombie, not a reused pid)."""
    try:
        pid = int(open(pid_file).read())
        os.kill(pid, 0)
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
        return any(marker in cmdline for marker in SWEEP_PROCESSES)
    except (OSError, ValueError, IndexError):
        return False


def why_stopped(sdir: str) -> str:
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


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def oom_kills_since_start(run_dir: str) -> tuple[str, int] | None:
    """(file, kills): how many OOM kills the kernel counted, since the run's start, where they
    could take its worker (meta.json's `oom_kills_at_start`, the supervisor's reading), or None."""
    try:
        with open(os.path.join(run_dir, "meta.json")) as fh:
            start = json.load(fh).get("oom_kills_at_start") or {}
        with open(start["file"]) as fh:
            now = next(int(line.split()[1]) for line in fh if line.startswith("oom_kill "))
    except (OSError, ValueError, KeyError, TypeError, IndexError, StopIteration):
        return None
    kills = now - start.get("count", now)
    return (start["file"], kills) if kills > 0 else None  # fewer after a reboot: none of this run's


def ended_without_supervisor(run_dir: str, rid: str, why: str) -> dict[str, Any]:
    """The result.json of a run whose sweep process died before it ended. `oom` when the kernel
    counted an OOM kill during the run: the worker is the killer's first choice, and a second
    kill while the worker's memory is still being freed can take the sweep too. Else `killed`
    and `cut_off`, so a restarted sweep runs it again."""
    counted = oom_kills_since_start(run_dir)
    if counted:
        return {"run_id": rid, "status": "oom", "oom_kills_during_run": counted[1],
                "detail": f"the worker was killed for memory (the oom_kill count in {counted[0]} rose by "
                          f"{counted[1]} during the run), and {why}: the runs after it did not start; "
                          "restart the sweep to run them"}
    return {"run_id": rid, "status": "killed", "cut_off": True,
            "detail": "the run never ended: " + why + "; restart the sweep to run it again"}


def one_component(name: object) -> bool:
    """Whether a name read from a sweep's record is one path component (a run id), never '..',
    a separator or hidden: it is joined to the sweep's own folder."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name \
        and not name.startswith(".")


def finalize(sdir: str, why: str) -> dict[str, Any] | None:
    """A sweep whose process is gone: each run it had `running` without a result.json gets one
    (`killed`, `cut_off`), and sweep.json becomes `stopped` with why. Nothing is done while a
    sweep process holds the directory's lock. Returns the new sweep.json, or None."""
    try:
        lock = open(os.path.join(sdir, ".sweep.lock"), "a+")
    except OSError:
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return None  # a sweep process works there
        state: dict[str, Any]
        try:
            with open(os.path.join(sdir, "sweep.json")) as fh:
                state = json.load(fh)
        except (OSError, ValueError):
            state = {"runs": {}}
        if state.get("state") not in (None, "running"):
            return state
        for rid, status in list(state.get("runs", {}).items()):
            if status != "running":
                continue
            if not one_component(rid):  # a hand-edited record: its run is over, and names no other folder
                state["runs"][rid] = "killed"
                continue
            run_dir = os.path.join(sdir, "runs", rid)
            result = os.path.join(run_dir, "result.json")
            if not os.path.exists(result) and os.path.isdir(run_dir):
                _write_json(result, ended_without_supervisor(run_dir, rid, why))
            try:
                with open(result) as fh:
                    state["runs"][rid] = json.load(fh).get("status", "killed")
            except (OSError, ValueError):
                state["runs"][rid] = "killed"
        state.update({"state": "stopped", "why": state.get("why") or why})
        _write_json(os.path.join(sdir, "sweep.json"), state)
        return state


def host_of(sdir: str) -> dict[str, Any] | None:
    """The sweep's host.json (the host that started it: fleet.deploy writes it) if an object, else None."""
    try:
        with open(os.path.join(sdir, "host.json")) as fh:
            host = json.load(fh)
    except (OSError, ValueError):
        return None
    return host if isinstance(host, dict) else None


def sweep_state(sdir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(sdir, "sweep.json")) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        state = {}
    try:
        folder = os.path.join(sdir, "specs")
        specs = sorted(f[:-5] for f in os.listdir(folder)
                       if f.endswith(".json") and not f.startswith(".") and os.path.isfile(os.path.join(folder, f)))
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
            final = finalize(sdir, why)
            runs = dict(final["runs"]) if final else {rid: ("stopped" if s == "running" else s)
                                                      for rid, s in runs.items()}
    else:
        shown = recorded
    return {"alive": is_alive, "state": shown, "why": why, "runs": runs, "specs": specs, "host": host_of(sdir)}


def main(workdir: str) -> dict[str, dict[str, Any]]:
    root = os.path.join(os.path.abspath(os.path.expanduser(workdir)), "sweeps")
    out = {}
    for sweep in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if not sweep.startswith(".") and os.path.isdir(os.path.join(root, sweep)):  # as sweeps.sh's `*/`
            out[sweep] = sweep_state(os.path.join(root, sweep))
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
