"""Metrics as CSV or JSON for scripts: one row per run, the columns of METRIC_COLUMNS with
each energy figure's estimated CO2 beside it and the grid's carbon intensity it used
(REPORT_COLUMNS; estimated figures carry `_est` in their names, CO2 `co2e_est`); JSON adds the
configurations and the intensity with its source."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from edgebench.figures.carbon import CarbonIntensity, beside_energy
from edgebench.results.metrics import METRIC_COLUMNS

REPORT_COLUMNS = beside_energy(METRIC_COLUMNS)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=REPORT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in REPORT_COLUMNS})
    return buf.getvalue()


def to_json(rows: list[dict[str, Any]], groups: list[dict[str, Any]] | None = None,
            carbon: CarbonIntensity | None = None) -> str:
    """`runs`: one row per run; `configurations`: repeats folded (each figure the median,
    `spread` its {median, min, max, n}); `carbon_intensity`: the grid's, that made the CO2."""
    return json.dumps({"columns": REPORT_COLUMNS, "runs": [{k: r.get(k) for k in REPORT_COLUMNS} for r in rows],
                       "configurations": groups or [], "carbon_intensity": (carbon or CarbonIntensity()).as_json()},
                      indent=2, default=str) + "\n"
