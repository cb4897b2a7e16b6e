"""The step-time model's rates as the native worker spends time (`edgebench-worker --rates`):
what `edgebench devices calibrate` measures on a device without Python.

methods.device_speed measures them with torch, which such a device does not have and whose
kernels are not the ones its runs use. The worker times instead: the matmuls of
methods.device_speed.SHAPES as an ExecuTorch program lowered the way training programs are
(exporters.executorch.lower_forward with XNNPACK: every weight a runtime input; a bf16 matmul
becomes XNNPACK's fp32 one between casts), its own update loop and its own MeZO generator.
The programs are exported here, on the host, once per content.

`python -m edgebench.native.rates` prints this host's, as `python -m edgebench.methods.device_speed`
prints torch's.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgebench.errors import EdgebenchError
from edgebench.methods import device_speed
from edgebench.runner.native import LAUNCHER

PROGRAMS = ("fp32", "bf16")  # <dtype>.pte in a rates folder, as the worker reads them


class RatesError(EdgebenchError, RuntimeError):
    """The worker's rates mode failed or printed something else; the message says what."""


def _products(shapes: tuple[tuple[int, int, int], ...], dtype: Any) -> tuple[Any, tuple[Any, ...]]:
    """A module whose forward(x0, g0, x1, g1, ...) returns, per shape, a linear layer's forward and
    its two backward products (x @ w, g @ w.T, x.T @ g: device_speed's), and its example inputs."""
    import torch

    class Products(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(i, c, dtype=dtype))
                                                  for _, i, c in shapes)

        def forward(self, *pairs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out: list[torch.Tensor] = []
            for k, w in enumerate(self.weights):
                x, g = pairs[2 * k], pairs[2 * k + 1]
                out += [x @ w, g @ w.t(), x.t() @ g]
            return tuple(out)

    example = tuple(torch.randn(*shape, dtype=dtype) for r, i, c in shapes for shape in ((r, i), (r, c)))
    return Products(), example


def program() -> Path:
    """The rates folder (fp32.pte and bf16.pte) for device_speed.SHAPES as they are when called,
    exported once per shapes, libraries and exporter source into the export cache."""
    from exporters.manifest import cache_root, library_versions, source_fingerprint
    from exporters.own_process import in_own_process, refuse_inside_export_process
    from exporters.pipeline import build_whole, locked

    refuse_inside_export_process()
    shapes = device_speed.SHAPES
    key = json.dumps([shapes, library_versions(), source_fingerprint(Path(__file__).resolve().parents[2]),
                      Path(__file__).read_text()])
    entry = cache_root() / f"rates-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    with locked(entry):
        if not all((entry / f"{name}.pte").is_file() for name in PROGRAMS):
            build_whole(entry, lambda work: in_own_process(_export, shapes, work))
    return entry


def _export(shapes: Any, work: Path, on_stage: Callable[[str], None]) -> None:
    """Lowers the rates programs into `work` (in the export's own process: exporters.own_process)."""
    import torch

    from exporters.executorch import lower_forward

    for name, dtype in zip(PROGRAMS, (torch.float32, torch.bfloat16)):
        on_stage(f"lower {name}")
        torch.manual_seed(0)
        module, example = _products(shapes, dtype)
        lower_forward(module, example, delegate="xnnpack").write(work / f"{name}.pte")


def command(worker: str, rates_dir: str) -> list[str]:
    """The worker's rates command line (bundle folder `worker`, rates folder `rates_dir`, as paths
    where it runs), at device_speed's repeats and sizes as they are when called (tests shrink them)."""
    return ["sh", f"{worker}/{LAUNCHER}", "--rates", rates_dir, "--repeats", str(device_speed.REPEATS),
            "--pass-elements", str(device_speed.PASS_ELEMENTS), "--normal-elements", str(device_speed.NORMAL_ELEMENTS)]


def read(stdout: str, where: str) -> dict[str, Any]:
    """The worker's rates line as a dict (RatesError naming `where` if it is not one)."""
    try:
        found = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        found = None
    if not isinstance(found, dict) or not isinstance(found.get("matmul_gflops"), (int, float)):
        shown = " ".join(stdout.split())[:200] or "nothing"
        raise RatesError(f"{where}: the native worker's rates mode printed {shown!r}, not its rates line")
    return found


def main() -> None:
    """Prints this host's native rates (builds the worker and exports the programs if needed)."""
    from edgebench.native.build import bundle

    done = subprocess.run(command(str(bundle()), str(program())), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr.strip())
    print(json.dumps(read(done.stdout, "this host")))


if __name__ == "__main__":
    main()
