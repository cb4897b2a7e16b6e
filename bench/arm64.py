"""What emulating arm64 costs: the same tiny run on this host's python and on the arm64 lab's
(arm64 wheels under qemu user-mode emulation), one after the other in one invocation.

Prints per method: median step time on each and their ratio (the emulated time says nothing
about an arm64 board: it is the emulator's), the worker's peak RSS (kernel ru_maxrss) on each
and the difference (qemu's own memory: what an emulated device's memory figures carry on top),
and both losses. Builds the emulation root first if it is not cached.

    .venv/bin/python bench/arm64.py [--methods sgd,lora] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgebench.devices import arm64
from edgebench.runner.spec import RunSpec

REPO = Path(__file__).resolve().parents[1]


def sweep(python: str, specs: list[RunSpec], directory: Path) -> dict[str, dict]:
    """Runs the specs as a device does (`python -m edgebench.runner.sweep`); results by run id."""
    (directory / "specs").mkdir(parents=True)
    for i, spec in enumerate(specs):
        spec.save(directory / "specs" / f"{i:03d}-{spec.run_id}.json")
    subprocess.run(
        [python, "-m", "edgebench.runner.sweep", str(directory)],
        check=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    return {s.run_id: json.loads((directory / "runs" / s.run_id / "result.json").read_text()) for s in specs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="sgd,lora")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    emulation = arm64.ensure(lambda i, what: print(f"building the arm64 root: {what}", flush=True))
    m = emulation.manifest
    print(f"root {emulation.root}: built in {m['build_s']:.0f} s, {m['disk_bytes'] / 1e9:.2f} GB on disk "
          f"({m['downloaded_bytes'] / 1e9:.2f} GB downloaded); `import torch` under {m['emulator']}: "
          f"{m['import_torch_s']:.1f} s, ru_maxrss {m['import_torch_maxrss_bytes'] / 2**20:.0f} MiB")
    specs = [RunSpec(method=method, steps=args.steps, warmup_steps=1, threads=1, run_id=method)
             for method in args.methods.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        host = sweep(sys.executable, specs, Path(tmp) / "host")
        host_s = time.monotonic() - started
        started = time.monotonic()
        emulated = sweep(emulation.python, specs, Path(tmp) / "emulated")
        emulated_s = time.monotonic() - started
    print(f"sweep wall time: host {host_s:.1f} s, emulated {emulated_s:.1f} s (times on a loaded host vary ~2x)")
    print(f"{'method':<8} {'step s host':>12} {'step s emu':>11} {'ratio':>7} {'peak MiB host':>14} "
          f"{'peak MiB emu':>13} {'+MiB':>6}  loss host -> emu")
    for spec in specs:
        h, e = host[spec.run_id], emulated[spec.run_id]
        hs, es = (h.get("step_time_s") or {}).get("median"), (e.get("step_time_s") or {}).get("median")
        hp, ep = h["peak_rss_bytes_kernel"] / 2**20, e["peak_rss_bytes_kernel"] / 2**20
        ratio = f"{es / hs:.0f}x" if hs and es else "-"
        print(
            f"{spec.method:<8} {hs or 0:>12.3f} {es or 0:>11.3f} {ratio:>7} {hp:>14,.0f} {ep:>13,.0f} "
            f"{ep - hp:>6,.0f}  "
            f"{h['loss_last']:.6f} -> {e['loss_last']:.6f} ({h['status']}/{e['status']})"
        )


if __name__ == "__main__":
    main()
