"""Estimated CO2: grams of CO2-equivalent from an energy figure and a grid's carbon intensity,
as codecarbon computes its emissions (C x E: g CO2e per kWh x the kWh consumed).

Every CO2 figure is an estimate twice over: the grid's intensity is one number for where and
when the device ran (the user's, else codecarbon's world average), never a reading; and where
the energy itself is estimated from a power model (`_est`), so is its CO2, in a column of its
own (`co2e_est_..._g_est`). Missing energy gives no CO2. docs/figures.md defines the figure.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgebench.errors import EdgebenchError

# codecarbon's world average: what it applies where it knows neither a country's intensity nor
# its energy mix (docs/explanation/methodology.md: "a world average of 475 gCO2.eq/KWh"), from
# the IEA's Global Energy & CO2 Status Report 2019.
DEFAULT_G_PER_KWH = 475.0
DEFAULT_WHAT = "codecarbon's world average (IEA, Global Energy & CO2 Status Report 2019)"
ENV = "EDGEBENCH_CARBON_INTENSITY"
OPTION = "--carbon-intensity"
J_PER_KWH = 3.6e6

# Each energy figure (metrics.METRIC_COLUMNS) and its CO2: `co2e_est` says the CO2 is an
# estimate, a trailing `_est` that the energy it comes from is (the power model's).
CO2_OF = {
    "energy_per_step_j": "co2e_est_per_step_g",
    "energy_per_sample_j": "co2e_est_per_sample_g",
    "energy_to_target_j": "co2e_est_to_target_g",
    "energy_per_step_j_est": "co2e_est_per_step_g_est",
    "energy_per_sample_j_est": "co2e_est_per_sample_g_est",
    "energy_to_target_j_est": "co2e_est_to_target_g_est",
}
INTENSITY_COLUMNS = ["carbon_intensity_g_per_kwh", "carbon_intensity_source"]


class CarbonIntensityError(EdgebenchError):
    """EDGEBENCH_CARBON_INTENSITY is not a number of grams per kWh."""


@dataclass(frozen=True)
class CarbonIntensity:
    """The grid's carbon intensity a report uses (g CO2e per kWh), and where it came from."""

    g_per_kwh: float = DEFAULT_G_PER_KWH
    set_by: str | None = None  # OPTION or ENV where the user set it; None: the default

    @property
    def source(self) -> str:
        return "default" if self.set_by is None else "user"

    @property
    def what(self) -> str:
        """`475 g CO2e/kWh, codecarbon's world average (...)`, or `..., set by --carbon-intensity`."""
        return f"{self.g_per_kwh:g} g CO2e/kWh, " + (DEFAULT_WHAT if self.set_by is None else f"set by {self.set_by}")

    def as_json(self) -> dict[str, Any]:
        return {"g_per_kwh": self.g_per_kwh, "source": self.source, "set_by": self.set_by, "what": self.what,
                "estimate": True}


def co2e_g(energy_j: float | None, g_per_kwh: float) -> float | None:
    """Grams of CO2e of `energy_j` joules on a grid of `g_per_kwh`: kWh (J / 3.6e6) x intensity,
    codecarbon's `emissions = energy consumed x carbon intensity`. No energy: None."""
    if energy_j is None or not math.isfinite(energy_j):
        return None
    return energy_j / J_PER_KWH * g_per_kwh


def with_co2(row: dict[str, Any], intensity: CarbonIntensity) -> dict[str, Any]:
    """`row` (a run's figures) with the CO2 of each of its energy figures and the intensity used."""
    out = dict(row)
    for energy, co2 in CO2_OF.items():
        out[co2] = co2e_g(row.get(energy), intensity.g_per_kwh)
    out["carbon_intensity_g_per_kwh"], out["carbon_intensity_source"] = intensity.g_per_kwh, intensity.source
    return out


def beside_energy(columns: list[str]) -> list[str]:
    """`columns` with each energy figure's CO2 right after it, and the intensity after `energy_source`."""
    out = []
    for c in columns:
        out.append(c)
        if c in CO2_OF:
            out.append(CO2_OF[c])
        if c == "energy_source":
            out += INTENSITY_COLUMNS
    return out


def valid_g_per_kwh(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def carbon_intensity(option: float | None = None, environ: Mapping[str, str] | None = None) -> CarbonIntensity:
    """The intensity to use: --carbon-intensity where given (checked by its click type), else
    EDGEBENCH_CARBON_INTENSITY where set, else the default (codecarbon's world average)."""
    if option is not None:
        return CarbonIntensity(float(option), OPTION)
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not text:
        return CarbonIntensity()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not valid_g_per_kwh(value):
        raise CarbonIntensityError(
            f"{ENV}={text!r} is not a finite number of 0 or more (g CO2e per kWh, e.g. {DEFAULT_G_PER_KWH:g}); "
            f"set it to your grid's intensity, or unset it for the default ({DEFAULT_WHAT})")
    return CarbonIntensity(value, ENV)
