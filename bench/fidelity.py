"""What a sampling rate can miss: sampled peak RSS vs the kernel's peak (ru_maxrss).

A child holds a baseline, then follows a pattern: `steady` (one spike held 1 s) or
`spike_Nms` (SPIKES times: map SPIKE_MIB of resident tmpfs pages, hold N ms, unmap). The
sampler watches it at each rate; the table shows the peak it saw next to the kernel's
high-water mark, and how many of the spikes any sample caught. Mapping a
spike's pages takes time too (`ramp_ms`), during which a sample sees part of it.

    .venv/bin/python bench/fidelity.py [--rates 20,50,100] [--spikes 8]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from edgebench.telemetry.sampler import Sampler
from edgebench.telemetry.trace import read_trace

MIB = 1 << 20
BASELINE_MIB = 64
SPIKE_MIB = 64

CHILD = """
import mmap, os, sys, tempfile, time
pattern, spikes, base_mib, spike_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
base = bytearray(b"\\x01") * (base_mib << 20)
# A spike maps an already-filled tmpfs file with MAP_POPULATE: its pages enter RSS in a few
# ms (no zeroing) and leave it at munmap, so spikes are sharp. Filled with write(), the
# file's pages are never in this process's RSS before they are mapped.
fd, path = tempfile.mkstemp(dir="/dev/shm")
os.unlink(path)
for _ in range(spike_mib):
    os.write(fd, b"\\x01" * (1 << 20))
time.sleep(0.3)
ramps = []
def spike(hold_s):
    t = time.perf_counter()
    held = mmap.mmap(fd, spike_mib << 20, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    ramps.append(time.perf_counter() - t)
    time.sleep(hold_s)
    held.close()
if pattern == "steady":
    spike(1.0)
else:
    for _ in range(spikes):
        spike(int(pattern.split("_")[1][:-2]) / 1000)
        time.sleep(0.2)
print(1000 * sum(ramps) / len(ramps))
"""


def run(pattern: str, rate_hz: float, spikes: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.jsonl"
        child = subprocess.Popen([sys.executable, "-c", CHILD, pattern, str(spikes), str(BASELINE_MIB), str(SPIKE_MIB)],
                                 stdout=subprocess.PIPE, text=True)
        sampler = Sampler(out, child.pid, rate_hz=rate_hz).start()
        ramp_ms = float(child.stdout.read().strip())
        _, _, usage = os.wait4(child.pid, 0)
        child.returncode = 0
        summary = sampler.stop()
        rss = [r["rss_bytes"] for r in read_trace(out).records if "rss_bytes" in r]
    kernel = usage.ru_maxrss * 1024
    threshold = kernel - SPIKE_MIB * MIB / 2  # the peak is baseline + one spike
    # Contiguous runs of samples above baseline + half a spike: one per spike seen.
    seen = sum(1 for prev, cur in zip([0] + rss, rss) if cur > threshold >= prev)
    return {"pattern": pattern, "rate_hz": rate_hz, "kernel_mib": kernel / MIB,
            "sampled_mib": (summary["peak_rss_bytes"] or 0) / MIB, "seen": seen,
            "spikes": 1 if pattern == "steady" else spikes, "ramp_ms": ramp_ms,
            "achieved_hz": summary["achieved_hz"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="20,50,100")
    parser.add_argument("--patterns", default="steady,spike_50ms,spike_5ms")
    parser.add_argument("--spikes", type=int, default=8)
    args = parser.parse_args()
    print(f"baseline {BASELINE_MIB} MiB, spikes of {SPIKE_MIB} MiB\n")
    print(f"{'pattern':11s} {'rate':>5s} {'got_hz':>6s} {'kernel_MiB':>10s} {'sampled_MiB':>11s} "
          f"{'missed_MiB':>10s} {'sampled/kernel':>14s} {'spikes_seen':>11s} {'ramp_ms':>7s}")
    for pattern in args.patterns.split(","):
        for rate in (float(r) for r in args.rates.split(",")):
            r = run(pattern, rate, args.spikes)
            print(f"{r['pattern']:11s} {r['rate_hz']:5.0f} {r['achieved_hz']:6.1f} {r['kernel_mib']:10.1f} "
                  f"{r['sampled_mib']:11.1f} {r['kernel_mib'] - r['sampled_mib']:10.1f} "
                  f"{r['sampled_mib'] / r['kernel_mib']:14.3f} {r['seen']:>5d}/{r['spikes']:<5d} {r['ramp_ms']:7.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
