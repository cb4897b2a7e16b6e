"""ExecuTorch's greedy memory plan, the same plan sooner.

`exir.memory_planning.greedy` sorts the program's tensors by size (largest first) and puts
each into the first shared object it fits: first one none of whose tensors it meets in
time, else the first with room above the tensors it meets. For each tensor it walks every
object's tensors, reading their lifetimes through attribute chains and recomputing their
sizes from shape and dtype (`TensorSpec.allocated_memory`); its sort recomputes sizes at
every comparison. nanoVLM-222M's SGD program spent 5.5 s there, LoRA's 15 s (py-spy).
`greedy_same_plan` makes the same choices in the same order, reading each object's placed
tensors as (first use, last use, end offset) kept beside it, sizes computed once per tensor,
then hands over to ExecuTorch's own storage-base and total-size steps: the same spec
results and buffer sizes (tests/test_export_executorch.py compares both on random
lifetimes, and the programs byte for byte). It reaches ExecuTorch through its public
`MemoryPlanningPass(memory_planning_algo=...)` (`memory_planning_pass`), never a patch; it
reads ExecuTorch's private planning helpers as of xnnpack_lowering.WRITTEN_FOR, so with any
other release the pass keeps ExecuTorch's own algorithm.
"""

from __future__ import annotations

from collections import defaultdict
from types import ModuleType
from typing import TYPE_CHECKING, Any

from exporters.xnnpack_lowering import WRITTEN_FOR, installed_executorch

if TYPE_CHECKING:
    import torch
    from torch.export import ExportGraphSignature

# ExecuTorch's planning objects (TensorSpec, SharedObject, MemoryAlgoResult) are upstream's untyped
# ones: Any. A placed tensor of an object: (first use, last use, end offset).
_Span = tuple[int, int, int]


def greedy_same_plan(alignment: int, specs: set[Any], graph_module: torch.fx.GraphModule,
                     graph_signature: ExportGraphSignature | None, extra_padding: int = 0, *,
                     allow_overlapping_allocations: bool = True) -> Any:
    """`exir.memory_planning.greedy`'s plan (same arguments, same result)."""
    from executorch.exir import memory_planning as plan

    result = plan.MemoryAlgoResult({}, [])
    spec_to_object: dict[Any, Any] = {}
    objects: defaultdict[int, list[Any]] = defaultdict(list)  # mem_id -> its SharedObjects, in creation order
    placed: defaultdict[int, list[list[_Span]]] = defaultdict(list)  # mem_id -> per object, its _Spans
    by_size = sorted(specs, key=lambda spec: spec.allocated_memory)  # bisect.insort's order
    by_size.reverse()
    deferred: list[Any] = []
    for spec in by_size:
        allocation = result.spec_dict.get(spec, plan.SpecAllocResult(0, 0, 0))
        allocation.mem_id = 1 if spec.mem_id is None else spec.mem_id
        result.spec_dict[spec] = allocation
        spec.realign(alignment)
        if spec.storage_base is not None:
            deferred.append(spec)
            continue
        spec_to_object[spec] = _pick(plan, objects[allocation.mem_id], placed[allocation.mem_id], spec,
                                     allow_overlapping_allocations)
    plan._resolve_storage_base_specs(deferred, spec_to_object, result)
    result.bufsizes = plan._compute_total_sizes(objects, graph_module, extra_padding, result,
                                                len(spec_to_object))
    return result


def _pick(plan: ModuleType, objects: list[Any], placed: list[list[_Span]], spec: Any,
          allow_overlapping_allocations: bool) -> Any:
    """`exir.memory_planning.pick_shared_obj` (`plan` is that module): the first object whose
    tensors all miss `spec` in time (at offset 0), else the first with room above those it
    meets, else a new one."""
    first, last = spec.lifetime
    size = spec.allocated_memory
    chosen, offset = None, 0
    for candidate, spans in zip(objects, placed):
        for start, end, _ in spans:
            if not (last < start or first > end):
                break
        else:
            assert candidate.size >= size, "Allocation specs are not sorted"
            chosen = candidate
            break
    if chosen is None and allow_overlapping_allocations:
        for candidate, spans in zip(objects, placed):
            top = 0
            for start, end, reach in spans:
                if not (last < start or first > end) and reach > top:
                    top = reach
            if top > 0 and top + size <= candidate.size:
                chosen, offset = candidate, top
                break
    if chosen is None:
        chosen = plan.SharedObject(len(objects), -1, size, first, last)
        objects.append(chosen)
        placed.append([])
    chosen.first_used_index = min(chosen.first_used_index, first)
    chosen.last_used_index = max(chosen.last_used_index, last)
    chosen.allocations.append(plan.AllocationSpec(offset, spec))
    placed[chosen.idx].append((first, last, offset + size))
    return chosen


def memory_planning_pass(**options: Any) -> Any:
    """ExecuTorch's MemoryPlanningPass (`options` as its own) planning with `greedy_same_plan`
    where the installed executorch is the release it was read from, else with ExecuTorch's
    default suite."""
    from executorch.exir import memory_planning as plan
    from executorch.exir.passes import MemoryPlanningPass

    if installed_executorch() != WRITTEN_FOR:
        return MemoryPlanningPass(**options)
    return MemoryPlanningPass(memory_planning_algo=plan.MemoryPlanningAlgorithmSuite(algo_list=[greedy_same_plan]),
                              **options)
