"""Run on a device by its python (`python -c SOURCE`): the Python facts `devices check` needs.

Standard library only, and nothing is imported from the libraries it looks for: it must
answer on a board where torch is missing or broken. Prints one JSON object.
"""

import importlib.metadata as md
import importlib.util as iu
import json
import os
import platform
import re
import sys


def version(module: str) -> "str | None":
    """The installed version of a module's distribution (found without importing it), or None."""
    if iu.find_spec(module) is None:
        return None
    try:
        return md.version(module)
    except md.PackageNotFoundError:
        return "unknown"


def torch_cuda() -> "str | None":
    """The CUDA version torch was built for (None: a CPU build), read from torch/version.py."""
    spec = iu.find_spec("torch")
    for location in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(location, "version.py")) as fh:
                found = re.search(r"^cuda\b[^=]*=\s*['\"]([^'\"]+)['\"]", fh.read(), re.M)
        except OSError:
            continue
        return found.group(1) if found else None
    return None


def cuda_runtime() -> bool:
    """Whether a CUDA runtime library is installed (pip's nvidia-* wheels or the system's): a CUDA
    build of torch does not import without it."""
    import glob
    from ctypes.util import find_library

    wheels = [hit for path in sys.path for hit in glob.glob(os.path.join(path, "nvidia", "**", "libcudart.so*"),
                                                             recursive=True)]
    return bool(wheels) or find_library("cudart") is not None


def training_ort() -> "str | None":
    """The version of ONNX Runtime with training APIs (plain onnxruntime has none), or None."""
    for dist in ("onnxruntime-training-cpu", "onnxruntime-training"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    return None


def main() -> None:
    print(json.dumps({
        "python": list(sys.version_info[:3]),
        "executable": sys.executable,
        "venv_module": iu.find_spec("venv") is not None and iu.find_spec("ensurepip") is not None,
        "torch": version("torch"),
        "torch_cuda": torch_cuda(),
        "cuda_runtime": cuda_runtime(),
        "numpy": version("numpy"),
        "psutil": version("psutil"),
        "executorch": version("executorch"),
        "onnxruntime_training": training_ort(),
        "machine": platform.machine(),  # the python's own: an emulated one differs from the shell's uname
        "emulator": os.environ.get("EDGEBENCH_EMULATOR"),  # the arm64 lab's python (devices/arm64.py)
    }))


if __name__ == "__main__":
    main()
