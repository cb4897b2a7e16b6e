"""The emulated lab for tests: devices whose state and inventory live in a temporary folder."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from edgebench.devices import lab
from edgebench.fleet.status import device_status

LAB_ENV = ("EDGEBENCH_LAB_DIR", "EDGEBENCH_INVENTORY")


@contextlib.contextmanager
def lab_in(root: Path, devices: list, state: str = "state") -> Iterator[list[dict]]:
    """Emulated lab devices whose lab state (ROOT/STATE) and inventory (ROOT/inventory.yaml) live
    under `root`: `lab up` on entry; on exit `lab down --purge` and the environment as it was."""
    saved = {k: os.environ.get(k) for k in LAB_ENV}
    os.environ["EDGEBENCH_LAB_DIR"] = str(root / state)
    os.environ["EDGEBENCH_INVENTORY"] = str(root / "inventory.yaml")
    try:
        yield lab.up(devices)
    finally:
        lab.down(purge=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def wait_for_sweep(name: str, sweep_id: str, timeout_s: float = 150, poll_s: float = 1.0) -> dict:
    """The sweep's status once it has ended (not alive, a final state). A status call that fails
    meanwhile is asked again: on a small lab device a run filling its memory limit can starve
    the status program beside it. The last error is named if the sweep never shows as ended."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        row = device_status(name)
        last = row.get("error") or row["sweeps"].get(sweep_id)
        if isinstance(last, dict) and not last["alive"] and last["state"] not in (None, "running"):
            return last
        time.sleep(poll_s)
    raise AssertionError(f"sweep {sweep_id} on {name} did not end in {timeout_s} s; last status: {last}")
