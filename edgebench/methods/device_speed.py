"""The device's own rates that the step-time model (methods.steptime) weighs its terms by,
measured, not assumed: how fast it multiplies matrices in fp32 and in bf16, how long one
elementwise pass over a weight takes, and how long drawing one normal sample takes.

They differ between CPUs by more than the methods differ from each other: bf16 matmuls run
five times faster than fp32 on a core with AMX and many times slower on one without bf16
instructions; a matmul-rich core with narrow memory makes optimizer updates weigh more. So
the ranking of methods holds for the device the rates were taken on. Measured once per CPU
model, torch version and thread count, and cached.

Its source runs alone (standard library and torch): `edgebench devices calibrate` runs it with
a device's own Python over its transport (`python -c`, before edgebench is shipped), and
`python -m edgebench.methods.device_speed` prints the same JSON here. A device without Python
is measured by the native worker instead (edgebench/native/rates.py), at these sizes.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

# (rows, inner, columns) of nanovlm-222m's matmuls for one sample: the decoder's MLP over
# 96 positions and the vision encoder's over 196 patches; each timed as a linear layer's
# forward and its two backward products.
SHAPES = ((96, 576, 1536), (196, 768, 3072))
PASS_ELEMENTS = 32 * 2**20  # large enough that three fp32 tensors of it stream from DRAM
NORMAL_ELEMENTS = 8 * 2**20
REPEATS = 3  # the fastest of these, after one warm-up call
# Under user-mode emulation (the arm64 lab's python says so in EDGEBENCH_EMULATOR) every rate is
# the emulator's, not representative: one timing each, no warm-up (bf16 matmuls emulated took the
# calibration past its 15 minutes)
EMULATED = bool(os.environ.get("EDGEBENCH_EMULATOR"))


@dataclass(frozen=True)
class DeviceSpeed:
    """matmul_gflops: fp32 matmul rate; bf16_matmul_cost: bf16 matmul time over fp32's (None:
    unknown); pass_ns: one elementwise pass (read two fp32 values, write one) per element;
    normal_ns: drawing one standard normal sample; source: where the figures come from."""

    matmul_gflops: float
    bf16_matmul_cost: float | None
    pass_ns: float
    normal_ns: float
    source: str


# Measured on a 2-core x86 host with AVX-512 and AMX (torch 2.13, 2 threads): the rates used for
# a device whose own are unknown, with its bf16 matmul cost left unknown (it is the rate that
# differs most between CPUs).
REFERENCE = DeviceSpeed(matmul_gflops=230.0, bf16_matmul_cost=None, pass_ns=0.44, normal_ns=4.8,
                        source="a reference x86 host's rates (this device's own are unknown)")


def cpu_model(cpuinfo: str) -> str | None:
    """The CPU model /proc/cpuinfo's text names (None: it names none); the host reads a device's
    without Python with it."""
    for line in cpuinfo.splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu part")):
            return line.split(":", 1)[1].strip()
    return None


def _cpu_model() -> str:
    try:
        found = cpu_model(Path("/proc/cpuinfo").read_text())
    except OSError:
        found = None
    return found or platform.processor() or platform.machine()


# what _fastest times (mypy infers no type for a lambda with defaults against it: a cast each time)
Timed = Callable[[], object]


def _fastest(call: Timed) -> float:
    if not EMULATED:
        call()
    times: list[float] = []
    for _ in range(1 if EMULATED else REPEATS):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def measure() -> DeviceSpeed:
    """This process's rates (its torch threads), taken now: about two seconds."""
    import torch

    generator = torch.Generator().manual_seed(0)
    flops = fp32 = bf16 = 0.0
    for rows, inner, columns in SHAPES:
        x, w, g = (torch.randn(*shape, generator=generator)
                   for shape in ((rows, inner), (inner, columns), (rows, columns)))
        flops += 3 * 2 * rows * inner * columns
        fp32 += _fastest(cast(Timed, lambda x=x, w=w, g=g: (x @ w, g @ w.t(), x.t() @ g)))
        x, w, g = x.bfloat16(), w.bfloat16(), g.bfloat16()
        bf16 += _fastest(cast(Timed, lambda x=x, w=w, g=g: (x @ w, g @ w.t(), x.t() @ g)))
    a, b, out = (torch.randn(PASS_ELEMENTS, generator=generator) for _ in range(3))
    pass_s = _fastest(cast(Timed, lambda a=a, b=b, out=out: torch.add(a, b, out=out)))
    samples = torch.empty(NORMAL_ELEMENTS)
    normal_s = _fastest(lambda: samples.normal_(generator=generator))
    return DeviceSpeed(matmul_gflops=flops / fp32 / 1e9, bf16_matmul_cost=bf16 / fp32,
                       pass_ns=pass_s / PASS_ELEMENTS * 1e9, normal_ns=normal_s / NORMAL_ELEMENTS * 1e9,
                       source="measured on this host")


def host_speed() -> DeviceSpeed:
    """This host's measure(), from the cache when it was taken for this CPU, torch and thread count."""
    import torch

    from edgebench.cache import cache_dir  # here: the module's source also runs alone on a device

    key = json.dumps([_cpu_model(), torch.__version__, torch.get_num_threads(), SHAPES, PASS_ELEMENTS])
    path = cache_dir("host") / f"speed-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    try:
        return DeviceSpeed(**json.loads(path.read_text())["speed"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    speed = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": json.loads(key), "speed": asdict(speed)}))
    return speed


def main() -> None:
    """Prints this process's rates and what they were measured on as one JSON object; without
    torch, `{"missing": "torch", "python": ...}` (the host names the fix)."""
    try:
        import torch
    except ImportError:
        print(json.dumps({"missing": "torch", "python": sys.executable}))
        return
    speed = {k: v for k, v in asdict(measure()).items() if k != "source"}
    print(json.dumps({"speed": speed, "cpu": _cpu_model(), "torch": torch.__version__,
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
