"""GPU figures: the CUDA allocator (inside the worker) and GPU load (from the sampler).

The CUDA caching allocator's counters live in the training process, so the sampler (in
the supervisor) cannot read them: the worker calls `cuda_memory_sample()` itself. Load
comes from the Jetson devfreq `load` file (per mille) or from NVML when pynvml is
installed; `gpu_load_pct` in either case.
"""

from __future__ import annotations

import sys
from pathlib import Path

from edgebench.telemetry.sysfs import PreadFile, SourceUnavailable, under

JETSON_LOAD_FILES = (
    "/sys/devices/gpu.0/load",  # Nano, TX2, Xavier (57000000.gpu)
    "/sys/devices/*.ga10b/load",  # Orin, JetPack 5 (17000000.ga10b)
    "/sys/devices/platform/*.gpu/load",  # Orin, JetPack 6 (17000000.gpu)
    "/sys/devices/platform/bus@0/*.gpu/load",
)


def cuda_status() -> str:
    """`available`, or why the CUDA allocator cannot be read in this process."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "unavailable: torch is not imported in this process"
    if not torch.cuda.is_available():
        return f"unavailable: torch {torch.__version__} sees no CUDA device"
    return "available"


def cuda_memory_sample(device: int | None = None) -> dict[str, int]:
    """The CUDA allocator's counters for use inside the worker; {} where CUDA is unavailable.

    Never imports torch itself: a process that has not imported it has no CUDA memory.
    """
    if cuda_status() != "available":
        return {}
    cuda = sys.modules["torch"].cuda
    return {
        "gpu_mem_allocated_bytes": int(cuda.memory_allocated(device)),
        "gpu_mem_reserved_bytes": int(cuda.memory_reserved(device)),
        "gpu_mem_peak_allocated_bytes": int(cuda.max_memory_allocated(device)),
    }


class JetsonGpuLoad:
    """`gpu_load_pct` from the Jetson GPU's devfreq `load` file (0-1000 per mille)."""

    name = "jetson_gpu_load"

    def __init__(self, root: str | Path = "/"):
        paths = [p for pattern in JETSON_LOAD_FILES for p in sorted(Path(root).glob(pattern.lstrip("/")))]
        if not paths:
            raise SourceUnavailable(f"no Jetson GPU load file under {under(root, '/sys/devices')} "
                                    f"(looked for {', '.join(JETSON_LOAD_FILES)})")
        self._file = PreadFile(paths[0], 32)
        if not self.read(0.0):
            raise SourceUnavailable(f"{paths[0]} is not readable as a number")

    def read(self, now_s: float) -> dict[str, float]:
        text = self._file.read()
        return {"gpu_load_pct": int(text) / 10.0} if text and text.isdigit() else {}

    def close(self) -> None:
        self._file.close()


class NvmlGpu:
    """`gpu_load_pct`, `gpu_mem_used_bytes` (device-wide) and `gpu_power_w` (the board's own
    reading, GPU only) through NVML; needs the pynvml module (nvidia-ml-py)."""

    name = "nvml_gpu"

    def __init__(self, index: int = 0):
        try:
            import pynvml
        except ImportError:
            raise SourceUnavailable("pynvml is not installed (pip install nvidia-ml-py)") from None
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except pynvml.NVMLError as exc:
            raise SourceUnavailable(f"NVML found no GPU {index}: {exc}") from None
        self._nvml = pynvml

    def read(self, now_s: float) -> dict[str, float]:
        nvml, handle = self._nvml, self._handle
        out: dict[str, float] = {
            "gpu_load_pct": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "gpu_mem_used_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
        }
        try:
            out["gpu_power_w"] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except nvml.NVMLError:
            pass  # not every board reports power
        return out

    def close(self) -> None:
        self._nvml.nvmlShutdown()
