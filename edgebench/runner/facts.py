"""Device facts and library versions for meta.json, read without importing torch."""

from __future__ import annotations

import os
import platform
import socket
import sys
from importlib import metadata

import psutil

from edgebench.figures.run_meta import DeviceFacts

LIBRARIES = ("edgebench", "torch", "numpy", "psutil", "executorch", "onnxruntime-training-cpu",
             "onnxruntime", "torchao", "peft", "galore-torch", "lomo-optim")


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries a run can use (absent ones are left out)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def device_facts() -> DeviceFacts:
    """meta.json's `device`, as this Python reads it."""
    return DeviceFacts(
        hostname=socket.gethostname(),
        arch=platform.machine(),
        platform=platform.platform(),
        python=sys.version.split()[0],
        cpu_count=os.cpu_count(),
        cpu_affinity=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        mem_total_bytes=psutil.virtual_memory().total,
        # set by the arm64 lab's python (qemu user-mode): step times are not representative
        # and memory figures include the emulator's own
        emulator=os.environ.get("EDGEBENCH_EMULATOR"),
    )
