"""`python -m edgebench.runner.sweep DIR`: run every DIR/specs/*.json in order.

Made to be started detached on a device: each run goes to DIR/runs/<run_id>/, the state
of every run is kept in DIR/sweep.json, and a run that already has result.json is not
run again, so a restarted sweep resumes where it stopped.

Honest about its state: SIGTERM or Ctrl-C stops the running run (`interrupted`) and no
further one starts (`interrupted` sweep); a full disk ends the run as `error` and the
sweep as `stopped` with why. A restart never writes into a partial run directory: the
partial one is kept as `<run_id>.attempt-N` with a result.json saying it was cut off,
and the run starts afresh. After a run cut short by a host-wide OOM the next one waits (at
most HOST_OOM_WAIT_S) for the device's memory to come back, so it does not start into the same
shortage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from edgebench.errors import EdgebenchError
from edgebench.figures.run_end import RECORD, RunEnd
from edgebench.figures.run_meta import RunMeta
from edgebench.figures.status import NO_SPACE, host_oom
from edgebench.runner.oom_score import shield_from_oom_kill
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import RESERVE_BYTES, RESERVE_FILE, Reserve, run_spec
from edgebench.telemetry.sysfs import under
from edgebench.telemetry.trace import write_json_atomic
from edgebench.untrusted import UnsafeName, path_name

# Bytes a run's traces take, per sample line and per step (two event lines); measured on
# tiny runs here (~330 B per sample line with cgroup and CPU fields), rounded up.
SAMPLE_LINE_BYTES = 512
STEP_BYTES = 400
RUN_FIXED_BYTES = 256 * 1024  # meta, spec, result, logs, the result reserve
MIN_TRACE_ROOM = 64 * 1024
STEP_S_GUESS = 5.0  # a step's time when only a step count is known (tiny on a Pi: ~1 s; 222M AdamW: ~30 s)
HOST_OOM_WAIT_S = 60.0  # the longest the next run waits for the memory a host-wide OOM took
MEMORY_POLL_S = 1.0


def spec_files(sweep_dir: Path) -> list[Path]:
    return sorted((sweep_dir / "specs").glob("*.json"))


def _run_id(path: Path) -> str:
    """The run id a spec file names (its file name's stem where it cannot be read)."""
    try:
        return RunSpec.load(path).run_id or path.stem
    except (OSError, ValueError, TypeError):
        return path.stem


def disk_needed_est(specs: list[RunSpec]) -> int:
    """Bytes the sweep's run directories need on the device (an estimate: a step count is
    taken at STEP_S_GUESS per step, a duration or timeout as given)."""
    total = 0
    for spec in specs:
        steps = spec.warmup_steps + spec.steps
        seconds = spec.duration_s or spec.timeout_s or steps * STEP_S_GUESS
        if spec.duration_s is not None:
            steps = max(steps, int(seconds * 10))  # up to 10 steps per second
        total += RUN_FIXED_BYTES + int(seconds * spec.sample_hz) * SAMPLE_LINE_BYTES + steps * STEP_BYTES
    return total


def keep_partial(run_dir: Path) -> Path:
    """Moves a run directory without a result.json of its own (none, or one the status helper wrote
    for a run cut off: `cut_off`) aside as `<run_id>.attempt-N` and gives
    it a result.json saying it was cut off, so nothing is written into it again."""
    n = 1
    while (kept := run_dir.with_name(f"{run_dir.name}.attempt-{n}")).exists():
        n += 1
    os.replace(run_dir, kept)
    try:  # its own record in the store, beside the fresh attempt (a bad record stays as it is: ingest names it)
        meta = RunMeta.from_json(json.loads((kept / "meta.json").read_text()), str(kept / "meta.json"))
        write_json_atomic(kept / "meta.json", dataclasses.replace(meta, run_id=kept.name).to_json())
    except (OSError, ValueError):
        pass
    write_json_atomic(kept / "result.json", {
        "status": "interrupted", "run_id": kept.name,
        "detail": (f"attempt {n} of {run_dir.name} was cut off: the sweep's process was gone before the run ended "
                   "(killed, the device restarted, or the disk filled up); the run was started again"),
    })
    (kept / RESERVE_FILE).unlink(missing_ok=True)
    return kept


def mem_available(root: str = "/") -> int | None:
    """MemAvailable in bytes from /proc/meminfo under `root`; None where it cannot be read."""
    try:
        for line in under(root, "/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def wait_for_memory(want: int, root: str = "/", limit_s: float = HOST_OOM_WAIT_S,
                    poll_s: float = MEMORY_POLL_S) -> str:
    """Waits until MemAvailable is back to `want` (what it was before the run a host-wide OOM cut
    short), at most `limit_s`: the next run then starts with the memory the last one had, or
    goes ahead after the bound. Says what it did, for the sweep's log."""
    started = time.monotonic()
    while True:
        now = mem_available(root)
        waited = time.monotonic() - started
        if now is None:
            return f"MemAvailable is unreadable under {root}: the next run starts without waiting"
        if now >= want:
            return f"waited {waited:.1f} s for MemAvailable to be back to {want // 2**20} MiB ({now // 2**20} MiB)"
        if waited >= limit_s:
            return (f"waited {waited:.1f} s, the limit: MemAvailable is {now // 2**20} MiB, not yet back to "
                    f"{want // 2**20} MiB; the next run starts anyway")
        time.sleep(min(poll_s, max(0.0, limit_s - waited)))


class AlreadyRunning(EdgebenchError, RuntimeError):
    """Another sweep process works in this directory."""


def _lock(sweep_dir: Path) -> Any:
    """Holds DIR/.sweep.lock for this process's life: two sweeps never share a directory."""
    import fcntl

    fh = open(sweep_dir / ".sweep.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise AlreadyRunning(f"{sweep_dir}: another sweep process is running there (see sweep.pid); "
                             "wait for it or stop it (kill -TERM PID) first") from None
    return fh


# In the device's sweeps folder, beside every sweep: held by the one sweep running there
# (runner/sweep.sh keeps the same rule with a lock folder of the same name + ".d").
DEVICE_LOCK = ".one-sweep-at-a-time"


def _device_lock(sweep_dir: Path) -> tuple[Any, str | None]:
    """(the lock, None) once this sweep holds the device's one-sweep lock for its process's life;
    (None, why) while another sweep holds it, naming that sweep. The kernel drops the lock when
    the holder dies, so a sweep killed while its host was away leaves none behind."""
    import fcntl

    fh = open(sweep_dir.parent / DEVICE_LOCK, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another one"
        fh.close()
        return None, (f"sweep {holder} is running on this device (one sweep at a time: two at once share its RAM "
                      "and CPU, and neither's figures hold); deploy again once it has ended (edgebench status)")
    fh.seek(0)
    fh.truncate()
    fh.write(sweep_dir.name)
    fh.flush()
    return fh, None


def _no_space(sweep_dir: Path) -> str | None:
    free = shutil.disk_usage(sweep_dir).free
    if free < RESERVE_BYTES + MIN_TRACE_ROOM:  # room for result.json and a little trace, or do not start
        return (f"{NO_SPACE}: {free // 1024} KiB free in {sweep_dir}; free some space, then restart the sweep "
                f"(python -m edgebench.runner.sweep {sweep_dir})")
    return None


def disturbed_again(spec: RunSpec, run_dir: Path, result: dict[str, Any], sweep_dir: Path) -> Path | None:
    """Where its run was disturbed (edgebench.figures.cpu: other processes or steal took more
    than the noise guard's share of the CPU), the spec again as a new spec file of the sweep,
    under `<run_id>-again` (the disturbed run stays, its re-run's spec names it: extra.rerun_of);
    else None."""
    from edgebench.figures.cpu import DEFAULT_CLOCK_TICKS, cpu_share

    try:  # a bad record (BadRecord, a ValueError) says nothing of its clock ticks: the default stands
        readings = RunMeta.from_json(json.loads((run_dir / "meta.json").read_text()),
                                     str(run_dir / "meta.json")).readings or {}
    except (OSError, ValueError):
        readings = {}
    ticks = readings.get("clock_ticks") or DEFAULT_CLOCK_TICKS
    share = cpu_share(result.get("cpu_start"), result.get("cpu_end"), ticks)
    if not (share or {}).get("disturbed"):
        return None
    again = RunSpec.from_dict({**spec.to_dict(), "run_id": f"{spec.run_id}-again",
                               "extra": {**spec.extra, "rerun_of": spec.run_id}})
    path = sweep_dir / "specs" / f"{len(spec_files(sweep_dir)):03d}-{again.run_id}.json"
    again.save(path)
    return path


def run_sweep(sweep_dir: str | Path, rerun_disturbed: int = 0, root: str = "/") -> dict[str, Any]:
    """Runs the sweep's specs in order; `rerun_disturbed`: at most this many re-runs of disturbed
    runs (disturbed_again), added to the sweep as they are found; `root`: where /proc and /sys are."""
    sweep_dir = Path(sweep_dir)
    lock = _lock(sweep_dir)  # noqa: F841 (held until run_sweep returns)
    (sweep_dir / "sweep.pid").write_text(f"{os.getpid()}\n")  # `edgebench status` checks this process
    state: dict[str, Any] = {"pid": os.getpid(), "state": "running", "started_wall_ns": time.time_ns(),
                             "runs": {}}
    device_lock, busy = _device_lock(sweep_dir)  # noqa: F841 (held until run_sweep returns)
    if busy:  # two deploys started together both passed deploy's check: this one starts nothing
        state.update(state="refused", why=busy, runs={_run_id(p): "not started" for p in spec_files(sweep_dir)})
        write_json_atomic(sweep_dir / "sweep.json", state)
        return state
    stop: dict[str, Any] = {"signal": None}
    reserve = Reserve(sweep_dir / ".sweep-reserve", 64 * 1024)

    def save() -> None:
        """sweep.json, even on a full disk (the reserve makes room once)."""
        try:
            write_json_atomic(sweep_dir / "sweep.json", state)
        except OSError:
            reserve.release()
            write_json_atomic(sweep_dir / "sweep.json", state)

    def on_signal(signum: int, frame: object) -> None:
        stop["signal"] = stop["signal"] or (
            "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name
        )

    # Restored on the way out: a sweep run in-process (tests, bench) must not leave its handlers behind.
    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        specs = spec_files(sweep_dir)
        reruns = sum(1 for p in specs if p.stem.endswith("-again"))  # a resumed sweep's earlier ones count
        refill: tuple[str, int] | None = None  # a run a host-wide OOM cut short, and MemAvailable before it
        for path in specs:  # grows by the re-runs of disturbed runs
            try:
                spec = RunSpec.load(path)
            except (OSError, ValueError, TypeError) as exc:  # a damaged spec file is that run's error, not the sweep's
                state["runs"][path.stem] = "error"
                state.setdefault("errors", {})[path.stem] = f"{path.name}: unreadable spec ({exc})"
                continue
            run_id = spec.run_id or path.stem
            try:
                path_name(run_id, f"{path.name}: run_id")  # runs/<run_id>/: never a path
            except UnsafeName as exc:
                state["runs"][path.stem] = "error"
                state.setdefault("errors", {})[path.stem] = str(exc)
                continue
            spec.run_id = run_id
            run_dir = sweep_dir / "runs" / run_id
            done = run_dir / "result.json"
            if done.exists():
                ended = json.loads(done.read_text())
                if not ended.get("cut_off"):  # cut_off: the status helper closed a run this sweep never ended
                    state["runs"][run_id] = ended["status"]
                    continue
            if refill is not None and not stop["signal"]:
                print(f"sweep: {refill[0]} ended in a host-wide OOM; {wait_for_memory(refill[1], root)}",
                      file=sys.stderr, flush=True)
                refill = None
            if stop["signal"] or state.get("why"):
                state["runs"][run_id] = "not started"
                continue
            if run_dir.exists():
                state["runs"][keep_partial(run_dir).name] = "interrupted"
            state["why"] = _no_space(sweep_dir)
            if state["why"]:
                state["runs"][run_id] = "not started"
                continue
            state["runs"][run_id] = "running"
            save()
            available_before = mem_available(root)
            try:
                result = run_spec(spec, run_dir, root=root)
            except OSError as exc:  # not even the run directory could be made
                state["runs"][run_id], state["why"] = "not started", f"cannot write in {sweep_dir}: {exc}"
                continue
            state["runs"][run_id] = result["status"]
            end = None if result.get(RECORD) is None else RunEnd(**result[RECORD])  # built here, not read
            if result["status"] == "killed" and end is not None and host_oom(end) and available_before is not None:
                refill = (run_id, available_before)  # the next run waits for it
            if NO_SPACE in str(result.get("detail")):
                state["why"] = result["detail"]
            again = disturbed_again(spec, run_dir, result, sweep_dir) if reruns < rerun_disturbed else None
            if again is not None:
                reruns += 1
                specs.append(again)
                state["runs"][_run_id(again)] = "not started"
            save()
        if stop["signal"]:
            state["state"], state["why"] = "interrupted", f"stopped by {stop['signal']}"
        else:
            state["state"] = "stopped" if state.get("why") else "finished"
        state["finished_wall_ns"] = time.time_ns()
        reserve.release()
        save()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgebench.runner.sweep",
                                     description="Run every DIR/specs/*.json in order (resumable).")
    parser.add_argument("dir")
    parser.add_argument("--rerun-disturbed", type=int, default=0, metavar="N",
                        help="run a disturbed run's spec again, N extra runs at most")
    args = parser.parse_args(argv)
    shield_from_oom_kill()  # an OOM kill takes the worker, and this process records it
    try:
        state = run_sweep(args.dir, args.rerun_disturbed)
    except AlreadyRunning as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(state["runs"]))
    if state["state"] == "refused":
        print(state["why"], file=sys.stderr)
    return {"finished": 0, "interrupted": 130, "refused": 2}.get(state["state"], 1)


if __name__ == "__main__":
    sys.exit(main())
