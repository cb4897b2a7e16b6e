"""Library chatter that users read as errors, silenced in one place (imported first by
`edgebench/__init__.py`, so before torch, torchao or executorch in every process, host
and device). None of it affects a run:

- torchao logs "Failed to load ..._C_mxfp8....so" for CUDA-only kernels on every CPU import;
- torch's pytree logs a deprecation for torchao's Enum registrations, and warns
  "`isinstance(treespec, LeafSpec)` is deprecated" while exporting;
- ExecuTorch's memory planning warns "... out0 kwarg value is None" for backward ops;
- asyncssh, as it is imported, makes cryptography warn five times that DSA is deprecated: its
  type hints name cryptography's DSA classes, which cryptography 51 deprecated. No key of
  edgebench's is DSA and no asyncssh release avoids the names yet; pinning cryptography below
  51 would trade its security fixes for quiet, so the warning (cryptography's
  CryptographyDeprecationWarning, a UserWarning) is dropped where asyncssh's modules raise it.

Their loggers keep ERROR and above; only these warnings (by message, and module where one
library alone raises it) are dropped. tests/test_quiet_commands.py runs each command as a user
does and fails on any warning that reaches the terminal.

One is not chatter: bitsandbytes (imported by peft and galore-torch) fetches a CPU 4-bit
kernel from the Hugging Face Hub as it is imported on CPUs with AVX512-BF16, then warns
"Failed to load CPU gemm_4bit_forward" where it cannot. edgebench uses none of its kernels and
downloads nothing while it runs, so that import runs with the Hub offline (and the kernels
package's "Skipping publisher trust check" and bitsandbytes' warning are dropped).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import warnings
from types import ModuleType

QUIET_LOGGERS = ("torchao", "torch.utils._pytree", "bitsandbytes.backends.cpu.ops", "kernels")
QUIET_WARNINGS = ((FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", ""),
                  (UserWarning, r"Function aten\..* kwarg value is None", ""),
                  (UserWarning, r"DSA is deprecated", r"asyncssh\."))


def quiet_libraries() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, message, module in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    if not any(isinstance(finder, HubOfflineImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, HubOfflineImport())


class HubOfflineImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `bitsandbytes` as Python would and runs its module with the Hub offline."""

    MODULE = "bitsandbytes"

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        self.loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            from huggingface_hub import constants
        except ImportError:  # no Hub client, so nothing to fetch with
            self.loader.exec_module(module)
            return
        offline, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
        try:
            self.loader.exec_module(module)
        finally:
            constants.HF_HUB_OFFLINE = offline
