"""Memory fidelity against the kernel's own accounting: a child allocates a known number of
bytes in steps (touching every page) and holds them; the sampled peak RSS must match the
kernel's ru_maxrss (wait4), and, in a real memory cgroup made for the test, the cgroup's
high-water mark. The cgroup counts page cache too, so its anonymous share (total_rss /
anon) is compared as well."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from edgebench.telemetry import memory
from edgebench.telemetry.sampler import Sampler
from edgebench.telemetry.trace import read_trace

STEP_BYTES = 64 << 20
STEPS = 6  # 384 MiB in all: python's own few MB of mapped files stay well under 2 %

# Waits for "go", allocates STEPS x STEP_BYTES (bytearray * n writes every page), says
# "held", and exits on the next line.
CHILD = f"""
import sys
sys.stdin.readline()
chunks = []
for _ in range({STEPS}):
    chunks.append(bytearray(b"\\x01") * {STEP_BYTES})
print("held", flush=True)
sys.stdin.readline()
"""


def make_test_cgroup(controller: str = "memory") -> tuple[Path | None, str]:
    """A fresh v1 cgroup under this process's own (so it stays inside whatever limits this
    session has), or None and why it cannot be made here."""
    found = memory.cgroup_dir(os.getpid(), controller)
    if found is None or found[0] != "v1":
        return None, f"no cgroup v1 {controller} hierarchy for this process ({found})"
    path = found[1] / f"edgebench-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        return None, f"cannot create {path}: {exc}"
    return path, ""


def run_child(cgroup: Path | None, out: Path, rate_hz: float):
    """Runs CHILD under the sampler; returns (summary, lines, ru_maxrss bytes)."""
    def join_cgroup():
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, preexec_fn=join_cgroup if cgroup else None)
    try:
        sampler = Sampler(out, child.pid, rate_hz=rate_hz).start()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "held"
        time.sleep(0.6)  # hold: the counters read at lower rates get their turn too
        child.stdin.write("exit\n")
        child.stdin.flush()
        _, _, usage = os.wait4(child.pid, 0)
        child.returncode = 0
        summary = {**sampler.stop(), "readings": sampler.readings()}
    finally:
        if child.returncode is None:
            child.kill()
            child.wait()
    return summary, read_trace(out).records, usage.ru_maxrss * 1024


def run_child_from_a_small_process(cgroup: Path | None, out: Path, rate_hz: float):
    """run_child, but from a fresh small process: Linux starts a forked child's ru_maxrss at
    its parent's RSS, so a parent that has grown (pytest after torch-heavy tests) would
    inflate the kernel figure this test compares against."""
    proc = subprocess.run([sys.executable, __file__, str(cgroup or ""), str(out), str(rate_hz)],
                          capture_output=True, text=True, timeout=120, check=True)
    summary, kernel_rss = json.loads(proc.stdout.splitlines()[-1])
    return summary, read_trace(out).records, kernel_rss


def test_sampled_peak_matches_kernel_peaks(tmp_path):
    cgroup, why = make_test_cgroup()
    try:
        summary, lines, kernel_rss = run_child_from_a_small_process(cgroup, tmp_path / "samples.jsonl", rate_hz=20)
        allocated = STEPS * STEP_BYTES
        assert kernel_rss > allocated

        def sampled(key: str) -> int:  # the highest reading of a key among the samples
            return max(r[key] for r in lines if key in r)

        assert sampled("rss_bytes") == pytest.approx(kernel_rss, rel=0.02)
        if cgroup is None:
            # Cgroups are not writable here: the summary must say what the cgroup figures are.
            assert summary["cgroup_status"] == "active" or "cgroup" in summary["cgroup_status"], why
            return
        memory_cgroup = summary["readings"]["memory_cgroup"]
        assert summary["cgroup_status"] == "active" and memory_cgroup["path"].endswith(cgroup.name)
        assert memory_cgroup["peak_scope"] == "run"
        kernel_cgroup_peak = lines[-1]["cgroup_peak_bytes"]  # the kernel's own high-water mark, read at the end
        print(f"\nallocated {allocated}, ru_maxrss {kernel_rss}, sampled rss {sampled('rss_bytes')}, "
              f"cgroup peak {kernel_cgroup_peak}, sampled cgroup usage {sampled('cgroup_usage_bytes')}, "
              f"sampled total_rss {sampled('cgroup_rss_bytes')}")
        assert kernel_cgroup_peak > allocated
        assert sampled("cgroup_usage_bytes") == pytest.approx(kernel_cgroup_peak, rel=0.02)
        assert sampled("rss_bytes") == pytest.approx(kernel_cgroup_peak, rel=0.02)
        assert sampled("cgroup_rss_bytes") == pytest.approx(kernel_cgroup_peak, rel=0.02)
        assert any("cgroup_usage_bytes" in r for r in lines)
    finally:
        if cgroup is not None:
            cgroup.rmdir()


def test_cpu_quota_throttling_is_seen(tmp_path):
    from tests.host_figures import figures_of, finite  # inside: this file also runs as a script

    cgroup, why = make_test_cgroup("cpu")
    # spins until it has had 0.3 s of CPU, however busy the host: at 20 % of a core that is at least
    # 1.5 s of wall time wanting more than its quota, so the cgroup must throttle it
    spin = "import time\nwhile time.process_time() < 0.3: pass\n"
    try:
        if cgroup is not None:
            (cgroup / "cpu.cfs_quota_us").write_text("20000\n")  # 20 ms per 100 ms period: 20 % of a core
        child = subprocess.Popen([sys.executable, "-c", spin], preexec_fn=(
            lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup else None)
        sampler = Sampler(tmp_path / "s.jsonl", child.pid, rate_hz=20).start()
        child.wait()
        summary = sampler.stop()
        if cgroup is None:
            assert "cgroup_cpu_throttle" in summary["sources_unavailable"], why
            return
        assert "cgroup_cpu_throttle" in summary["sources_active"]
        lines = read_trace(tmp_path / "s.jsonl").records
        throttled = [r["cpu_throttled_us"] for r in lines if "cpu_throttled_us" in r]
        assert throttled[-1] > throttled[0]  # ~1.2 s when the child gets its share; less on a busy host, never none
        shares = finite(figures_of(lines, sampler.readings())[0]["cpu_proc_pct"])
        assert shares and sum(shares) / len(shares) < 40
    finally:
        if cgroup is not None:
            cgroup.rmdir()


if __name__ == "__main__":
    _summary, _lines, _kernel_rss = run_child(Path(sys.argv[1]) if sys.argv[1] else None, Path(sys.argv[2]),
                                              float(sys.argv[3]))
    print(json.dumps([_summary, _kernel_rss]))
