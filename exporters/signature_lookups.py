"""A program's signature mappings built once per lowering phase, not once per look-up.

torch's ExportGraphSignature builds `inputs_to_buffers`, `buffers_to_mutate` and its other
name mappings anew from its spec lists at every access, and ExecuTorch's partitioner configs
(`is_constant_data`, for each node they match), memory planning, spec propagation and emission
look them up for each node or placeholder, several times over: time that grows with nodes
times specs. A program whose update is written into it (LOMO, the fused optimizers:
exporters/et_methods.py) has a weight, and for Adam two moment buffers, per trained tensor:
nanoVLM-222M's fused-adamw spent about 220 s of its 290 s `to_executorch`, and 40 s of
`to_edge`'s matching, building those mappings (py-spy). None of these phases changes a
signature, so while one runs (`_phases`) each mapping is built once per signature and served
again. Cutting partitions out (`_create_partitions`) renames the signature's outputs, not its
inputs: while it runs, the mappings of inputs (INPUT_MAPPINGS) are built once per signature
(nanoVLM-222M LoRA's cutting spent 7.3 s building them, once per partition), and one a rename
would change is built again. Elsewhere every access builds it as torch does. Written for
executorch xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from exporters.xnnpack_lowering import _replaced

INPUT_MAPPINGS = ("inputs_to_parameters", "inputs_to_buffers", "inputs_to_lifted_tensor_constants")
MAPPINGS = (*INPUT_MAPPINGS, "buffers_to_mutate")


def _phases():
    """[(owner, attribute name, the mappings it leaves as they are)] of the lowering's phases."""
    from executorch.exir.backend import backend_api
    from executorch.exir.backend.canonical_partitioners.config_partitioner import ConfigerationBasedPartitioner
    from executorch.exir.passes.memory_planning_pass import MemoryPlanningPass
    from executorch.exir.passes.spec_prop_pass import SpecPropPass
    from executorch.exir.program import _program

    return [(ConfigerationBasedPartitioner, "get_matched_nodes_from_configs", MAPPINGS),
            (MemoryPlanningPass, "run", MAPPINGS), (SpecPropPass, "update_placeholder_tensor_specs", MAPPINGS),
            (_program, "emit_program", MAPPINGS), (backend_api, "_create_partitions", INPUT_MAPPINGS)]


@contextlib.contextmanager
def signature_mappings_once_per_phase() -> Iterator[None]:
    """While lowering: inside the phases of `_phases`, each signature mapping the phase leaves
    as it is is built once per signature."""
    from torch.export.graph_signature import ExportGraphSignature

    # the running phases, innermost last: (mappings kept, {(id(signature), mapping): (signature, value)})
    running: list[tuple[tuple[str, ...], dict]] = []
    rename = ExportGraphSignature.replace_all_uses

    def memoised(name: str) -> property:
        build = getattr(ExportGraphSignature, name).fget

        def get(signature):
            if not running or name not in running[-1][0]:
                return build(signature)
            built, key = running[-1][1], (id(signature), name)
            if key not in built:
                built[key] = (signature, build(signature))  # the signature kept alive with its id
            return built[key][1]

        return property(get)

    def renaming(signature, old: str, new: str) -> None:
        for _, built in running:  # a mapping holding the old name is built again
            for key in [k for k, (held, value) in built.items() if held is signature and old in value]:
                del built[key]
        rename(signature, old, new)

    def phase(function, kept: tuple[str, ...]):
        def run(*args, **kwargs):
            running.append((kept, {}))
            try:
                return function(*args, **kwargs)
            finally:
                running.pop()

        return run

    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced(ExportGraphSignature, replace_all_uses=renaming,
                                      **{name: memoised(name) for name in MAPPINGS}))
        for owner, name, kept in _phases():
            stack.enter_context(_replaced(owner, **{name: phase(getattr(owner, name), kept)}))
        yield
