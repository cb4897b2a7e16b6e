"""The host's figures of raw readings in tests: what a device recorded, made into figures by
edgebench.figures exactly as the store and the report make them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgebench.figures.samples import columns_of, raw_columns, sample_figures
from edgebench.telemetry.trace import read_trace


def figures_of(records: list[dict[str, Any]], readings: dict[str, Any], spec: dict[str, Any] | None = None
               ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(figure columns, power account) of sample records."""
    return sample_figures(columns_of(records, *raw_columns(readings)), readings, spec or {})


def figures_of_file(path: Path, readings: dict[str, Any], spec: dict[str, Any] | None = None
                    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    return figures_of(read_trace(path).records, readings, spec)


def reads(source: Any, *times: float) -> list[dict[str, Any]]:
    """A source read at the given device times (s), as the sampler records it."""
    return [{"t_ns": int(t * 1e9), **source.read(t)} for t in times]


def finite(values: np.ndarray) -> list[float]:
    return [float(v) for v in values if np.isfinite(v)]


def measured(source: Any, spec: dict[str, Any] | None = None, t: float = 0.0) -> tuple[float | None, dict[str, Any]]:
    """(the host's power_w of one read of a power source, what it covers)."""
    readings = {"battery": source.readings()} if source.name == "battery" else {"rails": source.readings()}
    columns, account = figures_of(reads(source, t), readings, spec)
    watts = finite(columns["power_w"])
    return (watts[0] if watts else None), account


def rail_watts(source: Any, t: float = 0.0) -> dict[str, float]:
    """{rail_<name>_w: watts} of one read of a rail source that meters power directly, as the host makes them."""
    columns, _ = figures_of(reads(source, t), {"rails": source.readings()})
    return {k: finite(v)[0] for k, v in columns.items() if k.startswith("rail_") and finite(v)}


def temperatures(zones: Any) -> dict[str, float]:
    """{temp_<name>_c: °C} of one read of a temperature source, as the host names them."""
    columns, _ = figures_of(reads(zones, 0.0), {"temperatures": zones.names()})
    return {k: finite(v)[0] for k, v in columns.items() if k.startswith("temp_") and k != "temp_c_max" and finite(v)}
