"""The optimizers: one descriptor each, the one home of everything edgebench knows about one.

Every table about optimizers is derived from `OPTIMIZERS`: the choices of the method parser
(methods.knobs), their refusals (update inside backward, fusable, accumulable), the default
learning rates and the library behind each (methods.optim), the memory model's optimizer state,
update temporaries and library baseline (methods.memory), the step-time model's update traffic
(methods.steptime), which exported backend runs each and why not (backends.support), what the
ExecuTorch backend does between program calls (backends.et_optimizers), the constants the
program's own update and the native worker use (exporters.et_methods, native.plan), and whether
the native worker has it. A name that is not here is an error (`optimizer(name)`), never a
silent default; `tests/test_optimizers.py` walks every descriptor and checks each term.

Adding an optimizer = one `Optimizer(...)` below + its implementation (a class `build` names,
or a trainer in methods/ for an optimizer that owns the backward or the step).

Torch-free (the ONNX Runtime device process imports backends.support, which reads this):
the library classes are named by "module:Class" and imported only when built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgebench.errors import EdgebenchError

# nanoVLM TrainConfig: lr_vision_backbone = lr_language_backbone = 5e-5 (methods.optim has the rest).
NANOVLM_LR_BACKBONE = 5e-5
# torch.optim's SGD-momentum, Adam and AdamW as methods.optim builds them (torch's own defaults,
# written out because the exported update and the native worker repeat them: one value each).
SGD_MOMENTUM = 0.9
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
ADAMW_WEIGHT_DECAY = 0.01

# GaLore's projection (galore-torch): which parameters, at which rank (also the memory model's).
GALORE_RANK_MAX = 64
GALORE_UPDATE_PROJ_GAP = 200
GALORE_SCALE = 0.25


def is_galore_matrix(name: str, shape: tuple[int, ...]) -> bool:
    """GaLore projects the transformer blocks' weight matrices (as in its paper), nothing else."""
    return len(shape) == 2 and ".blocks." in name and min(shape) >= 8


def galore_rank(shape: tuple[int, ...]) -> int:
    """Rank of the projection: GALORE_RANK_MAX, or a quarter of a small matrix's short side."""
    return max(2, min(GALORE_RANK_MAX, min(shape) // 4))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# Optimizer state per trained parameter (name, shape) -> bytes: the memory model's term.
def no_state(name: str, shape: tuple[int, ...]) -> int:
    return 0


def one_state(name: str, shape: tuple[int, ...]) -> int:
    """One fp32 tensor the parameter's size (momentum buffer, CG direction)."""
    return 4 * _numel(shape)


def two_states(name: str, shape: tuple[int, ...]) -> int:
    """Adam's two fp32 moments."""
    return 8 * _numel(shape)


def factored_state(name: str, shape: tuple[int, ...]) -> int:
    """A factored second moment: a row and a column vector for a matrix, else a full one."""
    n = _numel(shape)
    return 4 * (shape[0] + n // shape[0]) if len(shape) >= 2 else 4 * n


def block_quantised_state(block: int, bytes_per_element: float) -> Callable[[str, tuple[int, ...]], int]:
    """torchao's low-bit AdamW: two moments of `bytes_per_element` plus an fp32 scale per
    `block`, for tensors it quantises (>= 4096 elements, a multiple of the block); fp32 else."""

    def state(name: str, shape: tuple[int, ...]) -> int:
        n = _numel(shape)
        if n >= 4096 and n % block == 0:
            return 2 * int(n * bytes_per_element + 4 * n // block)
        return 8 * n

    return state


def galore_state(name: str, shape: tuple[int, ...]) -> int:
    """A block matrix: its projector (short side x r) and Adam's two states of the projected
    gradient; any other parameter: plain Adam."""
    if is_galore_matrix(name, shape):
        r = galore_rank(shape)
        rows, cols = shape
        return 4 * min(rows, cols) * r + 8 * r * max(rows, cols)
    return 8 * _numel(shape)


@dataclass(frozen=True)
class Optimizer:
    """One optimizer: how it is built, what it costs, where it runs.

    Building and training:
      build: "module:Class" of the per-step optimizer methods.optim.build_optimizer makes
        (imported only then) with `build_options` and the constants below; for lomo-optim's the
        class its trainer makes; "" for an update edgebench writes itself (cg).
      trainer: "step" (backward, clip, then build's optimizer steps; BackpropTrainer and the
        fused trainer), "in-backward" (lomo-optim's fused_backward: LomoTrainer, which builds
        `build` itself) or "line-search" (methods.cg.ConjugateGradientTrainer).
      default_lr: the backbone lr when the user gives none and the run fine-tunes a checkpoint;
        fresh_lr: the same for a config's random weights (a run without a checkpoint): the lr
        bench/learning.py picked on tiny (methods.optim's FRESH_ tables say how; None: not
        measured, default_lr). adapter_lr_for: the trainable subsets (lora, bitfit) that take
        methods.optim.ADAPTER_LR (FRESH_ADAPTER_LR) instead.
      momentum, betas, eps, weight_decay: the constants edgebench passes (None: the library's
        own); the exported update and the native worker use the same values. weight_decay is the
        default a run's `--weight-decay` replaces (RunSpec.weight_decay).
      decay: how weight decay acts, as the library applies it: "l2" (torch's SGD and Adam: the
        gradient gets wd * w before the step, so it enters momentum and moments) or "decoupled"
        (AdamW's: w *= 1 - lr * wd, apart from the gradient); "" where it has none, and
        `no_decay` says why.
    Method knobs (methods.knobs refuses the rest, with the reason):
      fusable: `fused` may run it per parameter in backward hooks.
      whole_gradient: why it needs the whole batch's gradient at once ("" if it does not):
        no accumN, no fused.
      refuses_lora: why it cannot train LoRA ("" if it can).
    Memory model (methods.memory; estimates):
      state_bytes(name, shape): its persistent state for one trained parameter.
      gradient_copies: whole gradients alive at once (cg: this step's and the previous).
      step_copies: fp32 copies of all trained weights its step makes at once (cg: the new
        direction beside the old).
      update_copies: fp32 copies of the largest trained parameter one update holds.
      compiled_update: the update compiles per parameter shape (torch.compile's working set).
      library: the Python package it imports (its baseline RSS counts), "" for torch's own.
    Step-time model (methods.steptime; estimates):
      update_passes: one update's time per trained weight, in elementwise passes over an fp32
        weight (the device's time per pass: methods.device_speed); measured on nanovlm-222m's
        weights by `bench/step_model.py --updates` (torch's foreach kernels allocate between
        their ops; torchao's low-bit updates dequantise and requantise every block).
      extra_forwards: forward passes a step adds beyond backprop's (cg's line search).
    Exported backends (backends.support):
      executorch_refusal: why ExecuTorch cannot run it ("" if it can).
      onnxruntime: the update the ONNX Runtime backend applies in numpy between training-graph
        calls (backends.numpy_updates.UPDATES: "sgd", "adam" or "adamw"; "" if none).
      program_update: the update rule the ExecuTorch exporter can write into the program
        (exporters.et_methods.write_update: "sgd" or "adam"; "" if none), with `fused`, and
        always for an update in backward.
      between_calls: (library, what it keeps) for an update that runs in the Python runtime
        process between program calls, over the program's weights (backends.et_optimizers).
      native: edgebench's native ExecuTorch worker (C++, edgebench/native/worker.cpp) runs it.
    """

    name: str
    default_lr: float
    fresh_lr: float | None
    state_bytes: Callable[[str, tuple[int, ...]], int]
    update_passes: float
    build: str = ""
    build_options: tuple[tuple[str, object], ...] = ()
    trainer: str = "step"
    adapter_lr_for: tuple[str, ...] = ()
    momentum: float = 0.0
    betas: tuple[float, float] | None = None
    eps: float | None = None
    weight_decay: float = 0.0
    decay: str = "l2"
    no_decay: str = ""
    fusable: bool = False
    whole_gradient: str = ""
    refuses_lora: str = ""
    gradient_copies: int = 1
    step_copies: int = 0
    update_copies: float = 0
    compiled_update: bool = False
    library: str = ""
    extra_forwards: float = 0.0
    executorch_refusal: str = ""
    onnxruntime: str = ""
    program_update: str = ""
    between_calls: tuple[str, str] | None = None
    native: bool = False

    @property
    def update_in_backward(self) -> bool:
        """It updates each weight inside backward itself (lomo-optim)."""
        return self.trainer == "in-backward"

    @property
    def exported_backends(self) -> tuple[str, ...]:
        """The exported backends that run it."""
        return tuple(b for b, runs in (("executorch", not self.executorch_refusal),
                                       ("onnxruntime", bool(self.onnxruntime))) if runs)


OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    Optimizer("sgd", default_lr=5e-2, fresh_lr=0.15, state_bytes=no_state, update_passes=0.9, build="torch.optim:SGD",
              fusable=True, onnxruntime="sgd", program_update="sgd", native=True),
    Optimizer("sgd-momentum", default_lr=1e-2, fresh_lr=3e-2,
              state_bytes=one_state, update_passes=1.8, build="torch.optim:SGD",
              momentum=SGD_MOMENTUM, fusable=True, native=True),
    Optimizer("adam", default_lr=NANOVLM_LR_BACKBONE, fresh_lr=1.5e-3, state_bytes=two_states, update_passes=5.7,
              build="torch.optim:Adam", adapter_lr_for=("lora", "bitfit"), betas=ADAM_BETAS, eps=ADAM_EPS,
              fusable=True, update_copies=2, onnxruntime="adam", program_update="adam", native=True),
    Optimizer("adamw", default_lr=NANOVLM_LR_BACKBONE, fresh_lr=1.5e-3, state_bytes=two_states, update_passes=6.2,
              build="torch.optim:AdamW", adapter_lr_for=("lora", "bitfit"), betas=ADAM_BETAS, eps=ADAM_EPS,
              weight_decay=ADAMW_WEIGHT_DECAY, decay="decoupled", fusable=True, update_copies=2, onnxruntime="adamw",
              program_update="adam", native=True),
    Optimizer("adafactor", default_lr=1e-3, fresh_lr=3e-2, state_bytes=factored_state, update_passes=11.1,
              build="torch.optim:Adafactor", decay="decoupled", fusable=True, update_copies=1,
              between_calls=("torch.optim.Adafactor", "factored second moments")),
    Optimizer("adamw-8bit", default_lr=NANOVLM_LR_BACKBONE, fresh_lr=1.5e-3,
              state_bytes=block_quantised_state(256, 1.0),
              update_passes=65, build="torchao.optim:AdamW8bit", adapter_lr_for=("lora",),
              weight_decay=ADAMW_WEIGHT_DECAY, decay="decoupled",
              update_copies=5, compiled_update=True, library="torchao",
              between_calls=("torchao's AdamW8bit", "moments as 8-bit block-quantised torchao tensors")),
    Optimizer("adamw-4bit", default_lr=NANOVLM_LR_BACKBONE, fresh_lr=1.5e-3,
              state_bytes=block_quantised_state(128, 0.5),
              update_passes=77, build="torchao.optim:AdamW4bit", adapter_lr_for=("lora",),
              weight_decay=ADAMW_WEIGHT_DECAY, decay="decoupled",
              update_copies=8, compiled_update=True, library="torchao",
              between_calls=("torchao's AdamW4bit", "moments as 4-bit block-quantised torchao tensors")),
    Optimizer("galore", default_lr=NANOVLM_LR_BACKBONE, fresh_lr=5e-3, state_bytes=galore_state, update_passes=6.4,
              build="galore_torch:GaLoreAdamW", decay="decoupled",
              build_options=(("no_deprecation_warning", True),), update_copies=2, library="galore_torch",
              refuses_lora="GaLore projects full weight gradients; LoRA already makes them low-rank",
              between_calls=("galore-torch's GaLoreAdamW",
                             f"each block matrix's gradient projected to rank <= {GALORE_RANK_MAX}, "
                             f"the projector an SVD of the gradient every {GALORE_UPDATE_PROJ_GAP} steps")),
    Optimizer("lomo", default_lr=1e-2, fresh_lr=0.3, state_bytes=no_state, update_passes=0.9, build="lomo_optim:Lomo",
              trainer="in-backward", decay="decoupled", library="lomo_optim", program_update="sgd", native=True),
    Optimizer("adalomo", default_lr=1e-3, fresh_lr=None,
              state_bytes=factored_state, update_passes=11.1, build="lomo_optim:AdaLomo",
              trainer="in-backward", decay="decoupled", update_copies=1, library="lomo_optim",
              executorch_refusal=("lomo-optim's AdaLomo allocates its state with .cuda() (eager refuses it on CPU "
                                  "too); use lomo or adafactor")),
    Optimizer("cg", default_lr=5e-2, fresh_lr=0.15, state_bytes=one_state, update_passes=50, trainer="line-search",
              whole_gradient="needs the whole gradient before its line search", gradient_copies=2, step_copies=1,
              decay="", no_decay=("its Armijo line search tests the loss alone, which a decay term is not part "
                                  "of; leave --weight-decay out (or 0)"),
              # Armijo backtracking (data-dependent): 1.8 trial forwards a step over nanovlm-222m's first
              # five; each trial moves every weight recording what rounding loses, a rejected one undoes it
              extra_forwards=1.8,
              executorch_refusal=("conjugate gradient's Armijo line search evaluates the loss a data-dependent "
                                  "number of times per step at trial points; use --backend eager")),
)}

TRAINERS = ("step", "in-backward", "line-search")
DECAYS = ("l2", "decoupled", "")
PROGRAM_UPDATES = ("sgd", "adam")


class UnknownOptimizer(EdgebenchError, LookupError):
    """An optimizer name with no descriptor in OPTIMIZERS."""


def optimizer(name: str) -> Optimizer:
    """The descriptor of `name`; an error listing the choices for any other name."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise UnknownOptimizer(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}") from None


def run_weight_decay(name: str, requested: float | None) -> float:
    """The weight decay a run of optimizer `name` applies: `requested` (--weight-decay), else
    its descriptor's default (None keeps every earlier run's and export's value)."""
    return optimizer(name).weight_decay if requested is None else requested


def decay_refusal(name: str, requested: float | None) -> str | None:
    """Why optimizer `name` cannot apply `requested` weight decay (None: it can, or none asked)."""
    opt = optimizer(name)
    if opt.decay or not run_weight_decay(name, requested):
        return None
    return f"--weight-decay {requested:g} with {name}: {opt.no_decay}"
