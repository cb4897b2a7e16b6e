"""Metrics as CSV or JSON for scripts: one row per run, the columns of METRIC_COLUMNS
(estimated figures carry `_est` in their names); JSON adds the configurations."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from edgebench.results.metrics import METRIC_COLUMNS


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=METRIC_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in METRIC_COLUMNS})
    return buf.getvalue()


def to_json(rows: list[dict[str, Any]], groups: list[dict[str, Any]] | None = None) -> str:
    """`runs`: one row per run; `configurations`: repeats folded (each figure the median,
    `spread` its {median, min, max, n})."""
    return json.dumps({"columns": METRIC_COLUMNS, "runs": rows, "configurations": groups or []},
                      indent=2, default=str) + "\n"
