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
would change is built again. And each partition's own signature (`_get_new_signature`) is
built from a look-up of every input and output spec by name, made anew per partition (9.8 s
of lora-ckpt's export): while cutting runs, it is given only the specs its partition's
placeholders and call node's users name, in the signature's order, found in an index of the
signature kept across renames. Elsewhere every access builds it as torch does. Written for
executorch xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with it only.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from exporters.upstream import replaced

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram, ExportGraphSignature
    from torch.export.graph_signature import InputSpec, OutputSpec

    _Spec = InputSpec | OutputSpec

INPUT_MAPPINGS = ("inputs_to_parameters", "inputs_to_buffers", "inputs_to_lifted_tensor_constants")
MAPPINGS = (*INPUT_MAPPINGS, "buffers_to_mutate")


def _phases() -> list[tuple[object, str, tuple[str, ...]]]:
    """[(owner, attribute name, the mappings it leaves as they are)] of the lowering's phases."""
    from executorch.exir.backend import backend_api
    from executorch.exir.backend.canonical_partitioners.config_partitioner import ConfigerationBasedPartitioner
    from executorch.exir.passes.memory_planning_pass import MemoryPlanningPass
    from executorch.exir.passes.spec_prop_pass import SpecPropPass
    from executorch.exir.program import _program

    return [(ConfigerationBasedPartitioner, "get_matched_nodes_from_configs", MAPPINGS),
            (MemoryPlanningPass, "run", MAPPINGS), (SpecPropPass, "update_placeholder_tensor_specs", MAPPINGS),
            (_program, "emit_program", MAPPINGS), (backend_api, "_create_partitions", INPUT_MAPPINGS)]


class SpecIndex:
    """A signature's input and output specs by argument name, each with its place in its list."""

    def __init__(self, signature: ExportGraphSignature) -> None:
        self.inputs: dict[str, list[tuple[int, _Spec]]] = defaultdict(list)
        self.outputs: dict[str, list[tuple[int, _Spec]]] = defaultdict(list)
        spec: Any  # an InputSpec or OutputSpec: mypy joins enumerate over their lists' union to object
        for specs, index in ((signature.input_specs, self.inputs), (signature.output_specs, self.outputs)):
            for place, spec in enumerate(specs):
                index[spec.arg.name].append((place, spec))

    def renamed(self, old: str) -> None:
        """Files again, under its name now, each spec that was filed under `old`."""
        for index in (self.inputs, self.outputs):
            moved = index.pop(old, ())
            for place, spec in moved:
                index[spec.arg.name].append((place, spec))
            for name in {spec.arg.name for _, spec in moved}:
                index[name].sort(key=lambda entry: entry[0])

    def named(self, names: list[str]) -> SimpleNamespace:
        """A signature of the specs `names` name (inputs and outputs), in the signature's order."""
        def pick(index: dict[str, list[tuple[int, _Spec]]]) -> list[_Spec]:
            found = {place: spec for name in names for place, spec in index.get(name, ())}
            return [spec for _, spec in sorted(found.items())]

        return SimpleNamespace(input_specs=pick(self.inputs), output_specs=pick(self.outputs))


class _ProgramWithSignature:
    """`program` but for its graph signature."""

    def __init__(self, program: ExportedProgram, graph_signature: SimpleNamespace) -> None:
        self._program, self.graph_signature = program, graph_signature

    def __getattr__(self, name: str) -> Any:
        return getattr(self._program, name)

    def __str__(self) -> str:
        return str(self._program)


@contextlib.contextmanager
def signature_mappings_once_per_phase() -> Iterator[None]:
    """While lowering: inside the phases of `_phases`, each signature mapping the phase leaves
    as it is is built once per signature."""
    from executorch.exir import lowered_backend_module
    from torch.export.graph_signature import ExportGraphSignature

    # the running phases, innermost last: (mappings kept, {(id(signature), mapping): (signature, value)},
    # whether it cuts partitions out); a value built is a mapping (dict[str, str]) under a mapping's
    # name, a SpecIndex under SpecIndex
    running: list[tuple[tuple[str, ...], dict[tuple[int, object], tuple[ExportGraphSignature, Any]], bool]] = []
    new_signature = lowered_backend_module._get_new_signature
    rename = ExportGraphSignature.replace_all_uses

    def memoised(name: str) -> property:
        build = getattr(ExportGraphSignature, name).fget

        def get(signature: ExportGraphSignature) -> Any:
            if not running or name not in running[-1][0]:
                return build(signature)
            built, key = running[-1][1], (id(signature), name)
            if key not in built:
                built[key] = (signature, build(signature))  # the signature kept alive with its id
            return built[key][1]

        return property(get)

    def renaming(signature: ExportGraphSignature, old: str, new: str) -> None:
        for _, built, _ in running:  # a mapping holding the old name is built again
            for key in [k for k, (held, value) in built.items()
                        if held is signature and not isinstance(value, SpecIndex) and old in value]:
                del built[key]
        rename(signature, old, new)
        for _, built, _ in running:
            entry = built.get((id(signature), SpecIndex))
            if entry is not None:
                entry[1].renamed(old)

    # ExecuTorch's _get_new_signature: (signature, parameters, constants, input specs, output specs)
    def partition_signature(original_program: ExportedProgram, gm: torch.fx.GraphModule,
                            call_module_node: torch.fx.Node, tag: str, is_submodule: bool = False) -> Any:
        if not running or not running[-1][2]:
            return new_signature(original_program, gm, call_module_node, tag, is_submodule)
        signature, built = original_program.graph_signature, running[-1][1]
        key = (id(signature), SpecIndex)
        if key not in built:
            built[key] = (signature, SpecIndex(signature))
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"] + [u.name for u in call_module_node.users]
        program = _ProgramWithSignature(original_program, built[key][1].named(names))
        return new_signature(program, gm, call_module_node, tag, is_submodule)

    def phase(function: Callable[..., Any], kept: tuple[str, ...], cuts_partitions: bool) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            running.append((kept, {}, cuts_partitions))
            try:
                return function(*args, **kwargs)
            finally:
                running.pop()

        return run

    with contextlib.ExitStack() as stack:
        stack.enter_context(replaced(ExportGraphSignature, replace_all_uses=renaming,
                                      **{name: memoised(name) for name in MAPPINGS}))
        stack.enter_context(replaced(lowered_backend_module, _get_new_signature=partition_signature))
        for owner, name, kept in _phases():
            cuts_partitions = name == "_create_partitions"
            stack.enter_context(replaced(owner, **{name: phase(getattr(owner, name), kept, cuts_partitions)}))
        yield
