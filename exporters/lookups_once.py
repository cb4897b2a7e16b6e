"""Two of ExecuTorch's pure look-ups worked out once per argument, not once per use.

- `executorch.exir.tensor.dim_order_from_stride` declares a NamedTuple class to sort with on
  every call, and ExecuTorch calls it for every tensor spec it makes (spec propagation, memory
  planning's views, emission's placeholders): 7.0 s of nanoVLM-222M QLoRA's export, 6.3 s of it
  in `typing`'s class creation (py-spy at 20 Hz). For a stride of plain integers the order is a
  function of the stride alone, and a program's tensors share few strides: each such stride's
  order is served from the first call's result (a tuple: nothing can change it in place); a
  symbolic stride goes to ExecuTorch's function as before.
- ExecuTorch's JSON encoder of dataclasses (`exir._serialize._dataclass`, which writes each
  XNNPACK partition's graph for flatc) asks `typing.get_type_hints` of the object's class for
  every field of every object: 6.7 s of nanoVLM-222M LoRA-ckpt's 12.9 s serialising its 1,500
  partitions. A class's hints do not change while lowering; each class's are asked once (the
  encoder and decoder only read them).

Written for executorch xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it only.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Callable, Iterator
from typing import Any

from exporters.upstream import replaced

# ExecuTorch's dim_order_from_stride: a stride (integers, or symbolic ones) -> its dim order
_DimOrder = Callable[[Any], tuple[Any, ...]]


def _dim_orders_once(computed: _DimOrder) -> _DimOrder:
    orders: dict[tuple[int, ...], tuple[Any, ...]] = {}

    def dim_order_from_stride(stride: Any) -> tuple[Any, ...]:
        key = tuple(stride)
        if not all(type(s) is int for s in key):
            return computed(stride)
        if key not in orders:
            orders[key] = computed(stride)
        return orders[key]

    return dim_order_from_stride


def _type_hints_once(asked: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    hints: dict[type, dict[str, Any]] = {}

    def get_type_hints(cls: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if args or kwargs or not isinstance(cls, type):
            return asked(cls, *args, **kwargs)
        if cls not in hints:
            hints[cls] = asked(cls)
        return hints[cls]

    return get_type_hints


@contextlib.contextmanager
def lookups_once() -> Iterator[None]:
    """While lowering: each integer stride's dim order and each dataclass's type hints worked
    out once, then reused (in every module that imported the function by name)."""
    from executorch.exir import tensor, tensor_layout
    from executorch.exir._serialize import _dataclass
    from executorch.exir.emit import _emitter
    from executorch.exir.passes import replace_view_copy_with_view_pass

    dim_order = _dim_orders_once(tensor.dim_order_from_stride)
    with contextlib.ExitStack() as stack:
        for module in (tensor, tensor_layout, _emitter, replace_view_copy_with_view_pass):
            stack.enter_context(replaced(module, dim_order_from_stride=dim_order))
        stack.enter_context(replaced(_dataclass, get_type_hints=_type_hints_once(typing.get_type_hints)))
        yield
