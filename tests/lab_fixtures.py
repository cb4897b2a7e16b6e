"""The emulated lab for tests: devices whose state and inventory live in a temporary folder."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from edgebench.devices import lab

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
