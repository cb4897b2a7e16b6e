"""Temperatures from raw m°C readings, named after the zone types and hwmon sensors the device
read: `temp_<name>_c` per sensor (names made unique here, in the order the device listed
them), `temp_c_max` over all of them. A zone whose read failed is absent; one at or below
-256 °C (what powered-off Jetson zones read) is offline and left out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgebench.telemetry.sysfs import key_name, unique_names

OFFLINE_MILLI_C = -256000


def temperature_keys(temperatures: dict[str, Any]) -> dict[str, str]:
    """{raw key: `temp_<name>_c`} for the readings' temperatures ({raw key: name as read})."""
    raw = list(temperatures)
    names = unique_names([key_name(str(temperatures[k])) for k in raw])
    return {k: f"temp_{name}_c" for k, name in zip(raw, names)}


def celsius(milli_c: Any) -> np.ndarray:
    """°C from m°C (NaN for gaps); offline readings become NaN."""
    values = np.asarray(milli_c, dtype=float)
    return np.where(values > OFFLINE_MILLI_C, values / 1000.0, np.nan)
