"""A model's layout on the meta device: names, shapes and dtypes, with no storage and no draws.

torch's nn.init draws (normal_, uniform_, ...) on a meta tensor run as Python references that
import torch._dynamo on first use (+70 MiB of RSS beside torch alone) in a training worker that
never compiles, paid once the memory model or the streamed build lays a model out (arange's meta form imports
sympy the same way). The draws have no values to make there, so a torch-function mode (torch's
public override mechanism; this thread only) returns their tensor as it is, and arange makes its
few values (a rotary table's) on the CPU, where the arithmetic after it runs too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

_DRAWS = {nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_, nn.init.kaiming_uniform_,
          nn.init.kaiming_normal_, nn.init.xavier_uniform_, nn.init.xavier_normal_}


class _NoDraws(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        tensor = args[0] if args else kwargs.get("tensor")  # nn.init passes it by keyword
        if func in _DRAWS and getattr(tensor, "is_meta", False):
            return tensor
        if func is torch.arange and kwargs.get("device") is None:  # its meta form, and arithmetic on
            return func(*args, **kwargs, device="cpu")  # it, are references too: a few values on the CPU
        return func(*args, **kwargs)


@contextlib.contextmanager
def meta_layout() -> Iterator[None]:
    """Modules made inside are on the meta device, their initial draws skipped."""
    with torch.device("meta"), _NoDraws():
        yield
