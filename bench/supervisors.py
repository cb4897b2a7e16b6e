"""The same sweep on a device with Python and on one without (issue 54): the native ExecuTorch
worker under the Python supervisor (lab-pi4) and under the shell sweep (lab-pi4-nopy), both
emulated Raspberry Pi 4s (4 GiB, 4 cores by the profile, in their own cgroups). Every figure is
made on the host from what each recorded, so every column should be present on both, device
RAM should agree within 2 % and the energy estimate within 10 %.

Rounds interleave the devices (py, nopy, py, nopy, ...), one sweep at a time, so load from
other work hits both alike. Prints, per method, each figure's median on both devices and
their ratio (nopy / py), and which columns one device has and the other lacks.

    .venv/bin/python bench/supervisors.py                                  # tiny: sgd, lora, mezo
    .venv/bin/python bench/supervisors.py --methods sgd --rounds 3 --steps 30 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from edgebench.devices import lab
from edgebench.fleet.collect import collect_device
from edgebench.fleet.deploy import deploy_one
from edgebench.fleet.status import device_status
from edgebench.results.metrics import all_metrics
from edgebench.results.store import Store
from edgebench.runner.spec import RunSpec

PROFILE = "raspberry-pi-4-4gb"
FIGURES = {  # column -> how a ratio is read
    "device_ram_peak_bytes": "device RAM at peak",
    "peak_rss_bytes_kernel": "worker kernel RSS",
    "step_time_median_s": "step time, median",
    "energy_per_step_j_est": "energy per step (est.)",
    "power_mean_w_est": "mean power (est.)",
    "cpu_others_pct": "others' CPU %",
}
PRESENCE = ["device_ram_peak_bytes", "device_ram_limit_bytes", "device_ram_peak_what", "peak_rss_bytes_kernel",
            "step_time_median_s", "samples_per_s", "energy_per_step_j_est", "power_est_basis", "disturbed",
            "cpu_others_pct", "load_avg_1m", "loss_first", "loss_last"]


def wait_until_ended(name: str, sweep_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sweep = (device_status(name).get("sweeps") or {}).get(sweep_id)
        if isinstance(sweep, dict) and not sweep["alive"] and sweep["state"] not in (None, "running"):
            return
        time.sleep(1.0)
    raise SystemExit(f"{name}: sweep {sweep_id} did not end in {timeout_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--methods", default="sgd,lora,mezo")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", dest="json_out", help="Also write the rows to this file.")
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    root = Path(tempfile.mkdtemp(prefix="edgebench-supervisors-"))
    os.environ["EDGEBENCH_LAB_DIR"] = str(root / "lab")  # a lab of its own: the user's is left alone
    os.environ["EDGEBENCH_INVENTORY"] = str(root / "inventory.yaml")
    devices = [lab.LabDevice(PROFILE), lab.LabDevice(PROFILE, no_python=True)]
    names = [d.device_name() for d in devices]
    runs_dir, store_path = root / "runs", root / "runs" / "edgebench.duckdb"
    try:
        lab.up(devices)
        for round_no in range(args.rounds):
            for name in names:
                specs = [RunSpec(model=args.model, method=m, backend="executorch", runtime="native", steps=args.steps,
                                 warmup_steps=1, sample_hz=20) for m in methods]
                started = time.monotonic()
                deployment = deploy_one(name, specs, runs_dir, log=lambda line: print(line, file=sys.stderr))
                wait_until_ended(name, deployment.sweep_id, 600)
                print(f"round {round_no + 1}/{args.rounds}: {name} done in {time.monotonic() - started:.0f} s",
                      file=sys.stderr)
        for name in names:
            collect_device(name, None, runs_dir, store_path)
        with Store(store_path, read_only=True) as store:
            rows = all_metrics(store)
    finally:
        lab.down(purge=True)
    table = compare(rows, names, methods)
    print(render(table, names))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "table": table}, indent=2, default=str))
    return 0


def compare(rows: list[dict], names: list[str], methods: list[str]) -> list[dict]:
    """Per method: each figure's median per device, the ratio, and the columns only one has."""
    out = []
    for method in methods:
        per = {name: [r for r in rows if r["device"] == name and r["method"] == method and r["status"] == "ok"]
               for name in names}
        entry: dict = {"method": method, "runs": {n: len(per[n]) for n in names}, "figures": {}}
        for column in FIGURES:
            medians = [_median([r[column] for r in per[n]]) for n in names]
            ratio = medians[1] / medians[0] if None not in medians and medians[0] else None
            entry["figures"][column] = {"py": medians[0], "nopy": medians[1], "ratio": ratio}
        entry["missing"] = {n: sorted(c for c in PRESENCE if all(r.get(c) is None for r in per[n])) for n in names}
        out.append(entry)
    return out


def _median(values: list) -> float | None:
    have = [float(v) for v in values if isinstance(v, (int, float))]
    return statistics.median(have) if have else None


def render(table: list[dict], names: list[str]) -> str:
    lines = [f"{'method':8} {'figure':24} {names[0]:>12} {names[1]:>12} {'nopy/py':>8}"]
    for entry in table:
        for column, label in FIGURES.items():
            got = entry["figures"][column]
            fmt = (lambda v: "-" if v is None else f"{v / 2**20:.1f} MiB") if column.endswith("_bytes") else \
                (lambda v: "-" if v is None else f"{v:.4g}")
            ratio = "-" if got["ratio"] is None else f"{got['ratio']:.3f}"
            lines.append(f"{entry['method']:8} {label:24} {fmt(got['py']):>12} {fmt(got['nopy']):>12} {ratio:>8}")
        runs = ", ".join(f"{n}: {k}" for n, k in entry["runs"].items())
        missing = "; ".join(f"{n} lacks {', '.join(c)}" for n, c in entry["missing"].items() if c) or \
            "every column present on both"
        lines.append(f"{entry['method']:8} runs ok: {runs}; {missing}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
