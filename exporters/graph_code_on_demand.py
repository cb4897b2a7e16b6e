"""Graph modules' Python code generated when something runs or reads it, not at every change.

torch generates and compiles a graph module's Python code (`GraphModule.recompile`) each time
one is built or its graph replaced. ExecuTorch's stages build thousands (each XNNPACK
partition's submodule, its program, the copy XNNPACK preprocesses, every pass's result) and
almost never run them: they interpret the graph node by node. That code generation took 30 s
of nanoVLM-222M SGD's 142 s in to_edge and to_executorch (py-spy, 20 Hz). torch's own
`_LazyGraphModule` (what inductor builds its graph modules with) generates the code on first
call, `.code` or printing: `graph_code_on_demand` makes the graph modules of exported programs
lazy ones for the `with`, and so does each partition torch's `lift_subgraph_as_module` lifts
out (4.3 s of nanoVLM-222M lora-ckpt's cutting, py-spy). Only those: torch's switch for all
(`_use_lazy_graph_module`) also reaches dynamo, whose strict export reads a graph module's
input spec straight after building it (XNNPACK's upsampling pass exports a pattern so). The
`.pte` never carries that code, so it is the same byte for byte
(tests/test_export_executorch.py). Written
for torch 2.13 and executorch xnnpack_lowering.WRITTEN_FOR: `exporters.executorch` patches with
it only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from exporters.upstream import replaced

if TYPE_CHECKING:
    import torch


@contextmanager
def graph_code_on_demand() -> Iterator[None]:
    """While lowering: exported programs' graph modules, and lifted subgraphs', generate their
    code when first needed."""
    from torch.export import exported_program
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.passes.utils import common as fx_passes_common

    def lazy_graph_module(root: torch.nn.Module | dict[str, Any], graph: torch.fx.Graph) -> torch.fx.GraphModule:
        return _LazyGraphModule(root, graph)

    with replaced(exported_program, _create_graph_module_for_export=lazy_graph_module), \
            replaced(fx_passes_common, GraphModule=_LazyGraphModule):
        yield
