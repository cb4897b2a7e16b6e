"""The one registry of edgebench's replacements of upstream internals (ExecuTorch's and
torch's private functions, classes and settings that the exporters replace to lower a
training program in less time and memory).

Every replacement goes through `replaced(owner, **values)`, and every attribute it replaces
is an entry of REPLACEMENTS: its target (where it is defined upstream), a fingerprint of what
it replaces (sha256 of the source, or of the repr of a plain value) as read from the releases
in WRITTEN_FOR, and why. At use:

- an attribute upstream does not have is never created: the group is not applied;
- a fingerprint that differs (upstream changed what the replacement was written against)
  leaves the whole group unapplied, so upstream's own path runs, and one line on stderr names it.

None of the replacements changes the program an export writes, only the time and memory it
takes (tests/test_export_executorch.py compares the bytes with every group off), so upstream's
path is always a right, if slow, fallback: none needs to refuse. No upstream issue has been
filed for any of them yet (`upstream` stays empty until one is); each `why` says what one
would ask for.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

WRITTEN_FOR = (("executorch", "1.5.1"), ("torch", "2.13.0"))
_INHERITED = object()  # the replaced attribute was its class's base's
_SAID: set[str] = set()  # groups said unapplied, once a process
_LIVE: set[int] = set()  # ids of the values replaced() has put in place: a nested group finds its own


@dataclass(frozen=True)
class Replacement:
    target: str  # "module:Owner.attr", where upstream defines the attribute
    fingerprint: str  # 16 hex digits of sha256 of its source (or repr), as WRITTEN_FOR has it
    why: str  # the module that replaces it says how; this says what for
    upstream: str = ""  # the upstream issue or PR, once filed


def fingerprint(value: Any) -> str:
    """sha256 (16 hex digits) of a function's, property's or class's source, else of the value's repr."""
    if isinstance(value, property):
        value = value.fget
    try:
        text = inspect.getsource(value)
    except (TypeError, OSError):
        text = repr(value)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_SEEN: dict[int, tuple[Any, str]] = {}  # id -> (the object, kept alive so its id stays its own, its fingerprint)


def _fingerprint_once(value: Any) -> str:
    """`fingerprint`, read once a process per object: groups are entered many times a lowering."""
    seen = _SEEN.get(id(value))
    if seen is None or seen[0] is not value:
        seen = _SEEN[id(value)] = (value, fingerprint(value))
    return seen[1]


def target_of(owner: Any, name: str) -> str:
    """Where upstream defines `owner.name`: the module, or the class in owner's MRO that holds it."""
    if inspect.ismodule(owner):
        return f"{owner.__name__}:{name}"
    cls = owner if inspect.isclass(owner) else type(owner)
    if not inspect.isclass(owner) and name in vars(owner):  # an instance's own attribute
        return f"{cls.__module__}:{cls.__qualname__}().{name}"
    defining = next((c for c in inspect.getmro(cls) if name in vars(c)), cls)
    return f"{defining.__module__}:{defining.__qualname__}.{name}"


def resolve(target: str) -> Any:
    """The object a target names now ("module:attr" or "module:Class.attr")."""
    import importlib

    module, path = target.split(":")
    value: Any = importlib.import_module(module)
    for part in path.split("."):
        value = vars(value)[part] if inspect.isclass(value) else getattr(value, part)
    return value


def problem(owner: Any, name: str) -> str | None:
    """Why `owner.name` cannot be replaced as registered (None: it can)."""
    target = target_of(owner, name)
    entry = REPLACEMENTS.get(target)
    if entry is None:
        raise KeyError(f"{target}: replaced without an entry in exporters/upstream.py REPLACEMENTS")
    if not hasattr(owner, name):
        return f"{target} is gone upstream"
    if id(getattr(owner, name)) in _LIVE:  # replaced by an enclosing group, checked there
        return None
    now = _fingerprint_once(getattr(owner, name))
    if now != entry.fingerprint:
        return f"{target} changed upstream (fingerprint {now}, written against {entry.fingerprint})"
    return None


@contextlib.contextmanager
def replaced(owner: Any, **values: Any) -> Iterator[None]:
    """`owner`'s attributes replaced for the `with` only, restored afterwards, when every one is
    registered and matches upstream; else none is, and upstream's own path runs."""
    problems = [p for name in values if (p := problem(owner, name))]
    if problems:
        group = ", ".join(target_of(owner, name) for name in values)
        if group not in _SAID:
            _SAID.add(group)
            # stderr, not a logger: a library's logging set-up may have disabled ours, and this must be seen
            print(f"edgebench: not replacing {group} ({'; '.join(problems)}): upstream's own path runs",
                  file=sys.stderr)
        yield
        return
    own = vars(owner)
    originals = {name: own.get(name, _INHERITED) for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
        _LIVE.add(id(value))
    try:
        yield
    finally:
        _LIVE.difference_update(id(value) for value in values.values())
        for name, value in originals.items():
            if value is _INHERITED:
                delattr(owner, name)  # a class's override gone, its base's again
            else:
                setattr(owner, name, value)


LINEAR = ("XNNPACK delegation in time linear in the graph (exporters.xnnpack_lowering.linear_time_partitioning): "
          "ExecuTorch re-sorts and re-prints the whole graph for each of ~1,600 partitions at nanoVLM-222M size")
HANDLES = ("a delegate call's debug handle from a count, not a walk of the whole program per call "
           "(xnnpack_lowering.debug_handles_counted)")
PARTITIONS = "XNNPACK's GEMM configs look up the graph's source partitions once per graph, not per matmul"
PASSES = "XNNPACK's preprocess runs on a partition only the passes that can act on it (only_partition_passes)"
IDLE = "ExecuTorch's passes run only where they find work; to_edge re-traces once (exporters.idle_passes)"
CODE = "graph code generated when read, not at every change (exporters.graph_code_on_demand)"
LOOKUPS = "pure look-ups worked out once per argument (exporters.lookups_once)"
DELEGATES = "a delegate is run for its outputs' shapes only once, then recorded (exporters.recorded_delegate_outputs)"
SERIALISE = "the program serialised without a deep copy of it (exporters.serialise_in_place)"
SIGNATURE = "a signature's mappings built once per read-only phase, not at every access (exporters.signature_lookups)"
TRACES = "tracing without a stack trace per node (exporters.executorch)"

_ENTRIES = (
    ("executorch.backends.xnnpack.partition.config.gemm_configs:get_source_partitions", "2efa189daa77e24f", PARTITIONS),
    ("executorch.backends.xnnpack.xnnpack_preprocess:XNNPACKPassManager", "7fcec85f18a3016d", PASSES),
    ("executorch.exir._serialize._dataclass:get_type_hints", "63950b7482622d4e", LOOKUPS),
    ("executorch.exir._serialize._program:copy", "27dcfc53a4b9d4fb", SERIALISE),
    ("executorch.exir.backend.backend_api:_create_partitions", "a3259c8d375ddf13", SIGNATURE),
    ("executorch.exir.backend.backend_api:_create_partitions_in_graph_module", "2c8bd8d290ecfb2d", LINEAR),
    ("executorch.exir.backend.backend_api:_get_node_list_with_same_tag", "c23c9aa194460fcf", LINEAR),
    ("executorch.exir.backend.backend_api:_insert_lowered_submodule", "4174b1a43599b351", HANDLES),
    ("executorch.exir.backend.backend_api:_maybe_duplicate_constant_nodes", "fc17d3b7b99f9cf9", LINEAR),
    ("executorch.exir.backend.backend_api:create_submodule_from_nodes", "3279f5ec23b0b723", LINEAR),
    ("executorch.exir.backend.backend_api:get_lowered_module_name", "52a27653b8134d98", LINEAR),
    ("executorch.exir.backend.backend_api:lower_all_submodules_to_backend", "82b25ee7bd538f0c", HANDLES),
    ("executorch.exir.backend.canonical_partitioners.config_partitioner:"
     "ConfigerationBasedPartitioner.get_matched_nodes_from_configs", "0a4b7b5eef4b1a06", SIGNATURE),
    ("executorch.exir.emit._emitter:dim_order_from_stride", "0ffaacb8b17e529c", LOOKUPS),
    ("executorch.exir.lowered_backend_module:_get_new_signature", "7c0a21e3bc53f2fd", SIGNATURE),
    ("executorch.exir.lowered_backend_module:insert_subgm", "ecda62241a9f99b8", LINEAR),
    ("executorch.exir.pass_base:_ExportPassBase.call", "689e39bb23b9834c", IDLE),
    ("executorch.exir.passes.memory_planning_pass:MemoryPlanningPass.run", "7bb73589d0c874e5", SIGNATURE),
    ("executorch.exir.passes.replace_view_copy_with_view_pass:dim_order_from_stride", "0ffaacb8b17e529c", LOOKUPS),
    ("executorch.exir.passes.spec_prop_pass:ExportPass", "e5dbf59cc1c2ba4f", IDLE),
    ("executorch.exir.passes.spec_prop_pass:SpecPropPass.update_placeholder_tensor_specs", "9b0ebe220bbee936",
     SIGNATURE),
    ("executorch.exir.program._program:MemoryFormatOpsPass", "38438c41e1281c84", IDLE),
    ("executorch.exir.program._program:OpReplacePass", "a31a8cccd25a9fc6", IDLE),
    ("executorch.exir.program._program:ReplaceViewOpsWithViewCopyOpsPass", "f1e6c70f59ec928c", IDLE),
    ("executorch.exir.program._program:_get_aten_to_edge_passes", "8661a1a814cd6423", IDLE),
    ("executorch.exir.program._program:emit_program", "532df6c025dafcae", SIGNATURE),
    ("executorch.exir.program._program:serialize_for_executorch", "f82510b1ab0daff6", SERIALISE),
    ("executorch.exir.tensor:dim_order_from_stride", "0ffaacb8b17e529c", LOOKUPS),
    ("executorch.exir.tensor_layout:dim_order_from_stride", "0ffaacb8b17e529c", LOOKUPS),
    ("torch._higher_order_ops.executorch_call_delegate:call_delegate_cpu", "4e7ab5016a0073bc", DELEGATES),
    ("torch.export.exported_program:_create_graph_module_for_export", "48b7876d28b72335", CODE),
    ("torch.export.graph_signature:ExportGraphSignature.buffers_to_mutate", "6649727fe668cc6d", SIGNATURE),
    ("torch.export.graph_signature:ExportGraphSignature.inputs_to_buffers", "46d089e80e39192e", SIGNATURE),
    ("torch.export.graph_signature:ExportGraphSignature.inputs_to_lifted_tensor_constants", "267dde1485fc2c13",
     SIGNATURE),
    ("torch.export.graph_signature:ExportGraphSignature.inputs_to_parameters", "9570497adc19a1c4", SIGNATURE),
    ("torch.export.graph_signature:ExportGraphSignature.replace_all_uses", "fe08cf31ad424697", SIGNATURE),
    ("torch.fx._lazy_graph_module:_LazyGraphModule.__str__", "43459553992bb57f", LINEAR),
    ("torch.fx.config:do_not_emit_stack_traces", "60a33e6cf5151f2d", TRACES),
    ("torch.fx.graph_module:GraphModule.__str__", "d116372d3dbd0adf", LINEAR),
    ("torch.fx.passes.utils.common:GraphModule", "e597692620e1d1f0", CODE),
    ("torch.fx.passes.utils.fuser_utils:validate_partition", "a0c37557e1ac636a", LINEAR),
)
REPLACEMENTS: dict[str, Replacement] = {target: Replacement(target, fp, why) for target, fp, why in _ENTRIES}
