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
again; outside them (cutting partitions out renames the signature's outputs) every access
builds it as torch does. Written for executorch
xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from exporters.xnnpack_lowering import _replaced

MAPPINGS = ("inputs_to_parameters", "inputs_to_buffers", "buffers_to_mutate", "inputs_to_lifted_tensor_constants")


def _phases():
    """[(owner, attribute name)] of the phases that read signatures without changing them."""
    from executorch.exir.backend.canonical_partitioners.config_partitioner import ConfigerationBasedPartitioner
    from executorch.exir.passes.memory_planning_pass import MemoryPlanningPass
    from executorch.exir.passes.spec_prop_pass import SpecPropPass
    from executorch.exir.program import _program

    return [(ConfigerationBasedPartitioner, "get_matched_nodes_from_configs"), (MemoryPlanningPass, "run"),
            (SpecPropPass, "update_placeholder_tensor_specs"), (_program, "emit_program")]


@contextlib.contextmanager
def signature_mappings_once_per_phase() -> Iterator[None]:
    """While lowering: inside the read-only phases of `_phases`, each signature mapping of
    MAPPINGS is built once per signature."""
    from torch.export.graph_signature import ExportGraphSignature

    built: list[dict] = []  # the innermost running phase's {(id(signature), mapping): (signature, value)}

    def memoised(name: str) -> property:
        build = getattr(ExportGraphSignature, name).fget

        def get(signature):
            if not built:
                return build(signature)
            key = (id(signature), name)
            if key not in built[-1]:
                built[-1][key] = (signature, build(signature))  # the signature kept alive with its id
            return built[-1][key][1]

        return property(get)

    def phase(function):
        def run(*args, **kwargs):
            built.append({})
            try:
                return function(*args, **kwargs)
            finally:
                built.pop()

        return run

    with contextlib.ExitStack() as stack:
        stack.enter_context(_replaced(ExportGraphSignature, **{name: memoised(name) for name in MAPPINGS}))
        for owner, name in _phases():
            stack.enter_context(_replaced(owner, **{name: phase(getattr(owner, name))}))
        yield
