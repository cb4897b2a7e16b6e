"""The emitted program serialised as it stands, not from a deep copy of it.

`to_executorch` emits the program, then serialises it into the `.pte` bytes at once;
ExecuTorch's serialiser (`exir._serialize._program.serialize_pte_binary`) first deep-copies
the whole emitted program (every instruction, value and tensor description; 5.5 s of
nanoVLM-222M QLoRA's export, py-spy at 20 Hz) so that moving the constants and delegate
blobs out into segments leaves the emitted program as it was. Nothing reads those parts of it
afterwards here: the exporter reads only its execution plans' planned buffer sizes
(`planned_memory_bytes`), which serialising never touches, and writes the bytes made then.
So `serialised_in_place` lets the serialiser work on the emitted program itself, unless the
program keeps weights in an external data file (which ExecuTorch reads from the program after
serialising it). The bytes are the same (tests/test_export_executorch.py). Written for
executorch xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from exporters.upstream import replaced

_NO_COPY = SimpleNamespace(deepcopy=lambda program: program)


@contextlib.contextmanager
def serialised_in_place() -> Iterator[None]:
    """While lowering: `to_executorch` serialises the emitted program without copying it first."""
    from executorch.exir._serialize import _program as pte_serialiser
    from executorch.exir.program import _program

    serialise = _program.serialize_for_executorch

    # ExecuTorch's EmitterOutput in, its serialised program out: upstream's untyped objects
    def without_copy(emitter_output: Any, *args: Any, **kwargs: Any) -> Any:
        if emitter_output.external_constant_map:
            return serialise(emitter_output, *args, **kwargs)
        with replaced(pte_serialiser, copy=_NO_COPY):
            return serialise(emitter_output, *args, **kwargs)

    with replaced(_program, serialize_for_executorch=without_copy):
        yield
