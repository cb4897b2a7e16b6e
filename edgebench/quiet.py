"""Library chatter that users read as errors, silenced in one place (imported first by
`edgebench/__init__.py`, so before torch or torchao in every process, host and device):

- torchao logs "Failed to load ..._C_mxfp8....so" for CUDA-only kernels on every CPU import;
- torch's pytree logs a deprecation for torchao's Enum registrations.

Neither affects a run. Their loggers keep ERROR and above.
"""

from __future__ import annotations

import logging

QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_libraries() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
