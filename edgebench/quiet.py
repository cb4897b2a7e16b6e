"""Library chatter that users read as errors, silenced in one place (imported first by
`edgebench/__init__.py`, so before torch, torchao or executorch in every process, host
and device). None of it affects a run:

- torchao logs "Failed to load ..._C_mxfp8....so" for CUDA-only kernels on every CPU import;
- torch's pytree logs a deprecation for torchao's Enum registrations, and warns
  "`isinstance(treespec, LeafSpec)` is deprecated" while exporting;
- ExecuTorch's memory planning warns "... out0 kwarg value is None" for backward ops.

Their loggers keep ERROR and above; only these warnings (by message) are dropped.
"""

from __future__ import annotations

import logging
import warnings

QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
QUIET_WARNINGS = ((FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
                  (UserWarning, r"Function aten\..* kwarg value is None"))


def quiet_libraries() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for category, message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
