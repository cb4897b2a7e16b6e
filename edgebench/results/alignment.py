"""Clock alignment: device monotonic ns -> host wall-clock ns, NTP-style.

A probe is (host_send_ns, device_mono_ns, device_wall_ns, host_recv_ns): the host asks
the device for its clocks and times the round trip. Assuming the device read its clock
half-way through the round trip, host time at that instant is the midpoint, with an error
of at most half the round trip; so probes with slow round trips are discarded and a line
host = mono + offset + drift * (mono - ref) is fitted to the rest by least squares.
With no usable probe the device's own wall clock (meta.json clock pairs) stands in,
which is only as good as the device's NTP; the alignment says which source it used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgebench.figures.run_meta import RunMeta

SAME_BOOT_TOLERANCE_NS = 2_000_000_000  # device wall - mono moves only with NTP steps


@dataclass(frozen=True)
class Alignment:
    """host_ns = mono_ns + offset_ns + drift * (mono_ns - ref_mono_ns)."""

    source: str  # probes | meta | none
    offset_ns: int = 0
    drift: float = 0.0
    ref_mono_ns: int = 0
    probes_used: int = 0
    probes_discarded: int = 0
    max_error_ns: int | None = None  # half the worst round trip among the probes used
    note: str = ""

    def to_host_ns(self, mono_ns: np.ndarray | int) -> np.ndarray | int:
        mono = np.asarray(mono_ns, dtype=np.int64)
        host = mono + self.offset_ns + np.rint(self.drift * (mono - self.ref_mono_ns)).astype(np.int64)
        return host if host.ndim else int(host)

    def to_mono_ns(self, host_ns: np.ndarray | int) -> np.ndarray | int:
        """The inverse: host wall-clock ns -> device monotonic ns."""
        host = np.asarray(host_ns, dtype=np.int64)
        mono = self.ref_mono_ns + np.rint((host - self.offset_ns - self.ref_mono_ns) / (1.0 + self.drift)).astype(
            np.int64
        )
        return mono if mono.ndim else int(mono)


def _boot_wall_ns(meta: RunMeta | None) -> int | None:
    start = None if meta is None else meta.clock.start
    return None if start is None else start.wall_ns - start.mono_ns


def fit_probes(probes: Iterable[dict[str, Any]], rtt_factor: float = 2.0, rtt_slack_ns: int = 1_000_000,
               meta: RunMeta | None = None) -> Alignment | None:
    """Fits offset and drift to the probes taken in the same boot as the run in `meta`.

    A probe is kept when its round trip is at most `rtt_factor` times the fastest one
    plus `rtt_slack_ns`. Returns None when no probe is usable.
    """
    rows = [p for p in probes if all(p.get(k) is not None for k in ("host_send_ns", "device_mono_ns", "host_recv_ns"))]
    boot = _boot_wall_ns(meta)
    if boot is not None:
        rows = [p for p in rows if p.get("device_wall_ns") is None
                or abs(int(p["device_wall_ns"]) - int(p["device_mono_ns"]) - boot) <= SAME_BOOT_TOLERANCE_NS]
    if not rows:
        return None
    send = np.array([int(p["host_send_ns"]) for p in rows], dtype=np.int64)
    recv = np.array([int(p["host_recv_ns"]) for p in rows], dtype=np.int64)
    mono = np.array([int(p["device_mono_ns"]) for p in rows], dtype=np.int64)
    rtt = recv - send
    ok = rtt >= 0
    if not ok.any():
        return None
    keep = ok & (rtt <= rtt[ok].min() * rtt_factor + rtt_slack_ns)
    mid_minus_mono = (send[keep] + rtt[keep] // 2 - mono[keep]).astype(np.float64)
    ref = int(np.median(mono[keep]))
    x = (mono[keep] - ref).astype(np.float64)
    if keep.sum() >= 2 and np.ptp(x) > 0:
        drift, offset = np.polyfit(x, mid_minus_mono - mid_minus_mono.mean(), 1)
        offset += mid_minus_mono.mean()
        note = ""
    else:
        drift, offset = 0.0, float(np.median(mid_minus_mono))
        note = "one probe time: offset only, drift assumed 0"
    return Alignment("probes", int(round(offset)), float(drift), ref, int(keep.sum()), int(len(rows) - keep.sum()),
                     int(rtt[keep].max() // 2), note)


def from_meta(meta: RunMeta) -> Alignment:
    """Falls back to the device's wall clock from meta.json's clock pairs (not host-verified)."""
    start, end = meta.clock.start, meta.clock.end
    if start is None:
        return Alignment("none", note="no clock probes and no clock pairs in meta.json: host times unknown")
    ref = start.mono_ns
    offset = start.wall_ns - ref
    drift = 0.0
    if end is not None and end.mono_ns > ref:
        drift = ((end.wall_ns - end.mono_ns) - offset) / (end.mono_ns - ref)
    return Alignment("meta", offset, drift, ref,
                     note="no clock probes for this device: used the device's own wall clock from meta.json "
                          "(as good as its NTP; run collect to take probes)")


def align_run(probes: list[dict[str, Any]], meta: RunMeta) -> Alignment:
    """Probes when there are usable ones for this run's boot, else meta.json's clock pairs."""
    return fit_probes(probes, meta=meta) or from_meta(meta)
