"""A sweep on a device with no Python: what the host writes for edgebench/runner/sweep.sh.

Such a device runs only the native ExecuTorch worker, supervised by a POSIX shell. The shell
cannot parse JSON, so each spec also goes as a `.env` file of shell-quoted values; the spec's
JSON goes beside it, copied verbatim into the run's meta.json.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from edgebench.runner.spec import RunSpec
from edgebench.telemetry.sampler import INTERVALS_S

SWEEP_SCRIPT = "edgebench/runner/sweep.sh"  # inside the shipped package
WORKER_LINK = "worker"  # in the sweep folder: the worker bundle, whose --clock answers the clock probes
# The shell reads its sources in two groups, each as often as the Python sampler reads the
# slowest source of the group (telemetry.sampler.INTERVALS_S)
SHELL_CADENCES = {
    "MID_EVERY": ("system_memory", "process_cpu", "system_cpu", "cgroup_cpu", "battery"),
    "SLOW_EVERY": ("cgroup_memory_counters", "cgroup_cpu_throttle", "thermal_zones", "hwmon_temps"),
}


def refusal(spec: RunSpec) -> str | None:
    """Why `spec` cannot run on a device with no Python, with the fix; None if it can."""
    if spec.backend != "executorch" or spec.runtime != "native":
        return (f"the device has no Python: only the native ExecuTorch worker runs there (--backend executorch "
                f"--runtime native), not {spec.backend}" + (f" with the {spec.runtime} runtime" if
                                                            spec.backend == "executorch" else "")
                + "; install Python 3.10+ and psutil on the device, or choose the native runtime")
    return None


def env_file(spec: RunSpec, spec_json: str) -> str:
    """The .env the shell sweep sources for one run (every value quoted for sh)."""
    tick = 1.0 / spec.sample_hz
    every = {group: max(1, math.ceil(max(INTERVALS_S[name] for name in names) / tick))
             for group, names in SHELL_CADENCES.items()}
    power = ((spec.sensors or {}).get("power") or {}).get("source")
    values: dict[str, Any] = {
        "RUN_ID": spec.run_id,
        "SPEC_JSON": spec_json,
        "PROGRAM": spec.program,
        "WORKER": spec.native_worker,
        "PLAN": spec.native_plan,
        "TICK_S": f"{tick:.3f}",
        "MID_EVERY": str(every["MID_EVERY"]),
        "SLOW_EVERY": str(every["SLOW_EVERY"]),
        "TIMEOUT_S": str(math.ceil(spec.timeout_s) if spec.timeout_s else 0),
        "POWER": "battery" if power in (None, "auto", "battery") else "none",
    }
    return "".join(f"{key}={shlex.quote(str(value))}\n" for key, value in values.items())


def start_command(sweep: str) -> str:
    """Starts the shell sweep detached (as deploy starts the Python one)."""
    return (f"cd {shlex.quote(sweep)} && S=$(command -v setsid || true); "
            f"$S nohup sh pkg/{SWEEP_SCRIPT} {shlex.quote(sweep)} > sweep.log 2>&1 < /dev/null & echo $! > sweep.pid")
