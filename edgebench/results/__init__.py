"""Results: the DuckDB store, clock alignment, external traces, metrics, Pareto frontier."""

from pathlib import Path

DEFAULT_STORE = Path("runs") / "edgebench.duckdb"  # docs/interfaces.md: local runs go to ./runs/
