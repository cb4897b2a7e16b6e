"""Lowers the training step to ONNX Runtime training artifacts.

What ONNX Runtime training 1.19 needs (each found the hard way): the TorchScript exporter (dynamo=False) in
TRAINING mode at opset 17, LayerNormalization nodes given their optional Mean/InvStdDev
outputs (the gradient builder needs them), and onnxblock's CrossEntropyLoss with
ignore_index=-100 on flattened logits [N, vocab] and labels [N] (the LossType enum
reads -100 out of bounds, silently). ORT 1.19 reads IR version 10 at most.

Files the backend reads: training_model.onnx (MeZO: eval_model.onnx), nominal_checkpoint
(names, shapes, which train; no values) and parameters.safetensors (the values). ORT 1.19
loads a complete checkpoint by reading the whole file, then copying each weight out of it:
twice the weights at load, ONNX Runtime's peak for every method that trains few weights
(BitFit 1.25x eager's, MeZO-LoRA 1.32x on nanovlm-222m); the backend reads each value into
ORT's buffer itself (`edgebench.backends.onnxruntime.load_weights`).

No optimizer graph, on purpose. The backend applies the methods' recipe itself, in numpy
between training-graph calls (edgebench.backends.numpy_updates.RecipeUpdate): an onnxblock
optimizer graph takes one learning rate for every parameter, where nanoVLM's projector
trains at its own (100x the backbones' under Adam: ORT's AdamW losses left eager's at the
second step on nanovlm-222m, issue 29), and ORT 1.19's SGD optimizer allocates a zero
`first_order_moments` tensor per trained weight that SGDOptimizerV2 never reads (888 MiB on
nanovlm-222m, measured). So SGD, Adam and AdamW share one set of artifacts. The ONNX graph's
inputs are `input_ids`, `images`, `attention_mask` (padded keys masked, as nanoVLM trains)
and `labels` (already shifted and flattened:
`edgebench.backends.onnxruntime.shifted_labels`), so the device needs only numpy to feed it.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from edgebench.backends.onnxruntime import NOMINAL_CHECKPOINT, PARAMETERS, training_api

if TYPE_CHECKING:
    import onnx
    import onnxruntime

    from edgebench.model.vision_language_model import VisionLanguageModel

OPSET = 17
MAX_IR_VERSION = 10  # what onnxruntime 1.19 accepts
TRAINING_FILES = ("training_model.onnx", NOMINAL_CHECKPOINT, PARAMETERS)
FORWARD_FILES = ("eval_model.onnx", PARAMETERS)
STAGES = ("torch.onnx.export", "LayerNorm outputs", "training artifacts", "parameters")
GRAPH_INPUTS = ("input_ids", "images", "attention_mask")  # then the loss block's labels


class Artifacts(TypedDict):
    """What `export_artifacts` wrote: parameters in ONNX (= checkpoint) names, the files the
    backend needs, how many summed gradients accumulate part by part."""

    trainable_parameters: list[str]
    frozen_parameters: list[str]
    files: list[str]
    gradient_sums_accumulated_in_place: int


class TextLogits(torch.nn.Module):
    """The model's logits over text positions that have a next token, as [N, vocab]:
    the same positions and order as `model.forward`'s loss, without the loss."""

    def __init__(self, model: VisionLanguageModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, images: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.model.hidden_states(input_ids, images, attention_mask)[:, self.model.n_image_tokens : -1]
        logits: torch.Tensor = self.model.decoder.head(hidden)
        return logits.reshape(-1, logits.size(-1))


def add_layernorm_outputs(model: onnx.ModelProto) -> int:
    """Give every LayerNormalization node its optional Mean and InvStdDev outputs, which
    ORT's LayerNormalizationGrad reads. Returns how many nodes were changed."""
    count = 0
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([f"{node.name or node.output[0]}_mean", f"{node.name or node.output[0]}_inv_std"])
            count += 1
    return count


def _strip_wrapper_prefix(graph: onnx.GraphProto, prefix: str = "model.") -> None:
    """Name initializers as the torch model does (`TextLogits` adds `model.`)."""
    renamed: dict[str, str] = {}
    for init in graph.initializer:
        if init.name.startswith(prefix):
            renamed[init.name] = init.name[len(prefix):]
            init.name = renamed[init.name]
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]


def _onnx_names(model: torch.nn.Module, graph: onnx.GraphProto) -> dict[str, str]:
    """torch parameter name -> ONNX initializer name. Tied parameters are exported once,
    under one of their names; the other names map to it."""
    initializers = {init.name for init in graph.initializer}
    mapping: dict[str, str] = {}
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    for names in by_id.values():
        present = [n for n in names if n in initializers]
        if not present:
            raise RuntimeError(f"parameter {names[0]} is missing from the ONNX graph's initializers")
        for n in names:
            mapping[n] = present[0]
    return mapping


def export_artifacts(
    model: VisionLanguageModel,
    input_ids: torch.Tensor,
    images: torch.Tensor,
    attention_mask: torch.Tensor,
    out_dir: str | Path,
    *,
    training: bool = True,
    on_stage: Callable[[str], None] = lambda stage: None,
) -> Artifacts:
    """Writes the artifacts for `model` (trainable = requires_grad) into `out_dir`: the
    training graph for an update between calls, or (`training` False: MeZO) the eval graph.

    Returns {"trainable_parameters", "frozen_parameters"} in ONNX (= checkpoint) names, the
    files the backend needs, and how many summed gradients accumulate part by part.
    """
    import onnx
    import onnxruntime
    from onnxruntime.training import artifacts, onnxblock

    onnxruntime.set_default_logger_severity(3)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()  # no dropout: the graph must equal eager's
    on_stage("torch.onnx.export")
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # TracerWarnings about shape checks: shapes are fixed here
        warnings.simplefilter("ignore")
        _onnx_export(model, (input_ids, images, attention_mask), buffer)
    onnx_model = onnx.load_from_string(buffer.getvalue())
    on_stage("LayerNorm outputs")
    add_layernorm_outputs(onnx_model)
    onnx_model.ir_version = min(onnx_model.ir_version, MAX_IR_VERSION)
    _strip_wrapper_prefix(onnx_model.graph)

    names = _onnx_names(model, onnx_model.graph)
    trainable = sorted({names[n] for n, p in model.named_parameters() if p.requires_grad})
    frozen = sorted({names[n] for n, p in model.named_parameters() if not p.requires_grad})
    if set(trainable) & set(frozen):
        raise RuntimeError(f"tied parameters {sorted(set(trainable) & set(frozen))} are both trained and frozen")

    on_stage("training artifacts")
    with _quiet_graph_optimizer():
        artifacts.generate_artifacts(
            onnx_model,
            requires_grad=trainable,
            frozen_params=frozen,
            loss=onnxblock.loss.CrossEntropyLoss(ignore_index=-100),
            artifact_directory=out_dir,
            nominal_checkpoint=True,
        )
    on_stage("parameters")
    write_parameters(out_dir / "checkpoint", out_dir / PARAMETERS)
    (out_dir / "checkpoint").unlink()
    unfolded = _rewrite(out_dir / "training_model.onnx", accumulate_sums_in_place)
    files = list(TRAINING_FILES if training else FORWARD_FILES)
    for name in ("training_model.onnx", "eval_model.onnx"):
        if (out_dir / name).exists():
            _cap_ir_version(out_dir / name)
    return {"trainable_parameters": trainable, "frozen_parameters": frozen, "files": files,
            "gradient_sums_accumulated_in_place": unfolded}


def write_parameters(checkpoint: Path, out: Path) -> None:
    """The complete checkpoint's values as safetensors (ONNX names; the backend reads them a
    tensor at a time, a file the device can read without ORT's whole-file load)."""
    from safetensors.numpy import save_file

    state = training_api().CheckpointState.load_checkpoint(str(checkpoint))
    save_file({name: param.data for name, param in state.parameters}, str(out))


def accumulate_sums_in_place(model: onnx.ModelProto) -> int:
    """A gradient that is a Sum of parts (a weight used twice: the tied embedding and LM
    head) is added into its accumulation buffer part by part, by a chain of in-place
    accumulators, instead of summed first. The Sum kept both parts and their sum alive
    together (3 x 108 MiB for nanovlm-222m's embedding); now each part is added and freed
    as soon as it exists: -108 MiB at peak, the same gradients (measured). Returns how many
    Sums were unfolded."""
    from onnx import helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    count = 0
    for acc in [n for n in graph.node if n.op_type == "InPlaceAccumulatorV2"]:
        total = producer.get(acc.input[1])
        if total is None or total.op_type != "Sum" or len(total.input) < 2:
            continue
        if sum(total.output[0] in n.input for n in graph.node) != 1:
            continue  # the sum is read elsewhere too
        buffer, reset = acc.input[0], list(acc.input[2:3])  # the first part honours lazy_reset_grad
        chain: list[onnx.NodeProto] = []
        for i, part in enumerate(total.input[:-1]):
            out = f"{acc.input[0]}.part{i}"
            chain.append(helper.make_node("InPlaceAccumulatorV2", [buffer, part, *reset], [f"{out}.updated", out],
                                          name=f"{acc.name}_part{i}", domain=acc.domain))
            buffer, reset = out, []
        del acc.input[:]
        acc.input.extend([buffer, total.input[-1]])
        index = list(graph.node).index(total)
        graph.node.remove(total)
        for offset, node in enumerate(chain):
            graph.node.insert(index + offset, node)
        count += 1
    return count


def _rewrite(path: Path, transform: Callable[[onnx.ModelProto], int]) -> int:
    import onnx

    model = onnx.load(path)
    changed = transform(model)
    if changed:
        onnx.save(model, path)
    return changed


@contextlib.contextmanager
def _quiet_graph_optimizer() -> Iterator[None]:
    """generate_artifacts' graph optimizer logs every pass at INFO through its own
    SessionOptions (the default logger's severity does not reach it): give it quiet ones."""
    import onnxruntime
    from onnxruntime.training.onnxblock import _training_graph_utils

    def quiet_options() -> onnxruntime.SessionOptions:
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        return options

    original = _training_graph_utils.SessionOptions
    _training_graph_utils.SessionOptions = quiet_options
    try:
        yield
    finally:
        _training_graph_utils.SessionOptions = original


def _onnx_export(model: VisionLanguageModel, inputs: tuple[torch.Tensor, ...], buffer: io.BytesIO) -> None:
    torch.onnx.export(
        TextLogits(model),
        inputs,
        buffer,  # type: ignore[arg-type]  # torch types it a path; its TorchScript exporter (dynamo=False) takes a file too
        input_names=list(GRAPH_INPUTS),
        output_names=["logits"],
        dynamo=False,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
        opset_version=OPSET,
        export_params=True,
        keep_initializers_as_inputs=False,
    )


def _cap_ir_version(path: Path) -> None:
    """onnx >= 1.18 writes IR 14 graphs, which ORT 1.19 refuses; keep them at 10."""
    import onnx

    model = onnx.load(path)
    if model.ir_version > MAX_IR_VERSION:
        model.ir_version = MAX_IR_VERSION
        onnx.save(model, path)
