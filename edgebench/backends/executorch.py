"""The ExecuTorch backend: the exported training program (`.pte`) steps in ExecuTorch's runtime.

Backprop methods run the joint forward-backward program; the update follows the methods'
recipe (exporters and eager share it: projector lr group, global-norm clip 1.0, warmup +
cosine schedule). SGD updates in the runtime (`get_sgd_optimizer`), with the clip and
schedule folded into the gradients it is given; Adam/AdamW/SGD-momentum run torch.optim
over the program's own parameter tensors (`named_parameters()` aliases the program's
weights, so in-place updates train it); so do torchao's low-bit AdamW, GaLore and Adafactor.
LOMO and the fused update are written into the program, which updates its weights itself
(edgebench.backends.et_optimizers.UpdatingProgram). MeZO runs a forward-only program whose
trainable weights are inputs, perturbed in place by the methods' MeZO trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from edgebench.backends import et_optimizers
from edgebench.backends.program import BATCH_INPUTS, ProgramError, check_batch, open_program, program_lr
from edgebench.methods import optim, parse_method

PTE = "model.pte"
TRAINABLE_INIT = "trainable_init.pt"


class ProgramMeZOTrainer(Protocol):
    """What `_program_mezo` returns: the methods' MeZO trainer over the forward-only program."""

    program: Any  # the loaded ExecuTorch module (pybind)
    params: list[torch.nn.Parameter]

    def step(self, batch: dict[str, torch.Tensor]) -> float: ...


def _as_inputs(batch: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.as_tensor(batch[k]) for k in BATCH_INPUTS)


def clip_gradients(grads: list[torch.Tensor], max_norm: float, scale: float = 1.0, parts: int = 1) -> None:
    """torch.nn.utils.clip_grad_norm_ on gradient tensors themselves (it reads `.grad`),
    times `scale` in the same pass (one sweep over the gradients instead of two). `parts`:
    the gradients are sums over that many micro-batches (accumN), divided by it here, as
    eager's loss/N divides each micro-batch's."""
    total = torch.nn.utils.get_total_norm(grads) / parts
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0) * (scale / parts)
    torch._foreach_mul_(grads, coef)


class ProgramUpdate:
    """The methods' update step over a program's named parameters and gradients."""

    def __init__(self, optimizer: str, lr: float, total_steps: int, weight_decay: float) -> None:
        self.optimizer = optimizer
        self.lr = lr
        self.weight_decay = weight_decay
        self.total_steps = total_steps
        self.steps_done = 0
        self.runtime_sgd: list[tuple[Any, list[str]]] | None = None
        self.torch_optimizer: torch.optim.Optimizer | None = None

    def _groups(self, params: dict[str, torch.Tensor]) -> list[tuple[float, list[str]]]:
        """nanoVLM's lr groups by name: projector at max(lr, lr_mp), backbones at lr."""
        projector = [n for n in params if optim.is_projector(n)]
        backbone = [n for n in params if not optim.is_projector(n)]
        groups = [(self.lr, backbone), (max(self.lr, optim.NANOVLM_LR_MP), projector)]
        return [(lr, names) for lr, names in groups if names]

    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], parts: int = 1) -> None:
        """One update; `grads` are sums over `parts` micro-batches (accumN), divided here."""
        # Plain SGD is linear in the gradient: scaling it by the schedule applies it exactly.
        sgd = self.optimizer == "sgd"
        scale = optim.lr_factor(self.steps_done, self.total_steps) if sgd else 1.0
        clip_gradients(list(grads.values()), optim.MAX_GRAD_NORM, scale, parts)
        if sgd:
            if self.weight_decay:  # torch SGD's L2 after the clip, scheduled as the gradient: g += wd * w
                torch._foreach_add_(list(grads.values()), [params[n] for n in grads], alpha=self.weight_decay * scale)
            self._runtime_sgd(params, grads)
        else:
            self._torch_step(params, grads)
        self.steps_done += 1

    def _runtime_sgd(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        from executorch.extension.training import get_sgd_optimizer

        if self.runtime_sgd is None:
            self.runtime_sgd = [(get_sgd_optimizer({n: params[n] for n in names}, lr), names)
                                for lr, names in self._groups(params)]
        for sgd, names in self.runtime_sgd:
            sgd.step({n: grads[n] for n in names})

    def _torch_step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        if self.torch_optimizer is None:
            groups: list[dict[str, Any]] = [{"params": [params[n] for n in names], "lr": lr}
                                            for lr, names in self._groups(params)]
            if self.optimizer == "galore":  # optim.galore_groups over the program's tensors
                groups = [{"params": [t], "lr": lr, **optim.galore_options(n, tuple(t.shape))}
                          for lr, names in self._groups(params) for n in names for t in [params[n]]]
            self.torch_optimizer = optim.build_optimizer(self.optimizer, groups, self.weight_decay)
        for name, tensor in params.items():
            tensor.grad = grads[name]
        optim.set_schedule([self.torch_optimizer], self.steps_done, self.total_steps)
        with torch.no_grad():
            self.torch_optimizer.step()
        for tensor in params.values():
            tensor.grad = None


class TrainingProgram:
    """A joint forward-backward program, stepped without copying its gradients.

    ExecuTorch's Python `TrainingModule` clones every gradient out of the memory plan on
    each step (one extra copy of all trainable weights' size). Here the gradients are
    views of the plan's arena, valid until the next step, which is all the update needs.
    The method's outputs are [user outputs, gradients, parameters]; the program's
    `__et_training_*` methods say where each part starts and the parameters' names.
    """

    def __init__(self, path: str, method: str = "forward", enable_etdump: bool = False) -> None:
        from executorch.extension.pybindings.portable_lib import _load_for_executorch

        self.module = _load_for_executorch(path, enable_etdump=enable_etdump)
        self.method = method
        self.grad_start = self.module.run_method(f"__et_training_gradients_index_{method}", ())[0]
        self.param_start = self.module.run_method(f"__et_training_parameters_index_{method}", ())[0]
        self.names = list(self.module.run_method(f"__et_training_fqn_{method}", ()))
        self.params: dict[str, torch.Tensor] | None = None
        self.grads: dict[str, torch.Tensor] = {}

    def forward_backward(self, inputs: tuple[torch.Tensor, ...]) -> float:
        outputs = self.module.run_method(self.method, inputs, clone_outputs=False)
        self.grads = dict(zip(self.names, outputs[self.grad_start:self.param_start]))
        if self.params is None:  # the program's own weights: updated in place, they train it
            self.params = dict(zip(self.names, outputs[self.param_start:]))
        return float(outputs[0])

    def named_parameters(self) -> dict[str, torch.Tensor]:
        if self.params is None:
            raise RuntimeError("the program's parameters are known after its first step")
        return self.params


class ExecutorchBackend:
    name = "executorch"

    def __init__(self, etdump: bool = False) -> None:
        self.module: TrainingProgram | et_optimizers.UpdatingProgram | None = None
        self.update: ProgramUpdate | None = None
        self.stepper: (et_optimizers.PerParameterStep | et_optimizers.AccumulatingStep
                       | et_optimizers.UpdatingProgram | None) = None
        self.mezo: ProgramMeZOTrainer | None = None
        self.manifest: dict[str, Any] = {}
        self.etdump = etdump  # ExecuTorch's per-operator profile (`edgebench export --profile`)

    @property
    def lowering(self) -> dict[str, Any]:
        """How the program was lowered (delegate, kernels, where weights live): from its manifest."""
        lowering: dict[str, Any] = self.manifest.get("lowering", {})
        return lowering

    @property
    def runtime_module(self) -> Any:
        """The loaded ExecuTorch module (pybind), e.g. to write its ETDump."""
        if self.mezo is not None:
            return self.mezo.program
        assert self.module is not None, "setup() first"
        return self.module.module

    def setup(self, spec: Any, example_batch: dict[str, Any]) -> None:
        try:
            import executorch.extension.training  # noqa: F401
        except ImportError as exc:
            from edgebench.backends.base import UnsupportedBackend

            raise UnsupportedBackend(
                f"ExecuTorch's training runtime is not importable here ({exc}); "
                "`pip install executorch==1.5.1` (wheels exist for x86_64 and aarch64 with torch 2.13.0)"
            ) from None
        if spec.threads:
            from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

            _unsafe_reset_threadpool(spec.threads)  # XNNPACK's and the kernels' pool
        method = parse_method(spec.method)
        directory, self.manifest = open_program(spec, self.name, method.knobs())
        check_batch(self.manifest, et_optimizers.first_micro_batch(example_batch, method.accumulation), directory)
        lr = program_lr(spec.lr, method, self.manifest, fresh_weights=spec.fresh_weights)
        weight_decay = et_optimizers.program_weight_decay(spec.weight_decay, method, self.manifest, directory)
        total = spec.warmup_steps + spec.steps
        if method.grad_mode == "zeroth-order":
            self.mezo = _program_mezo(directory, self.manifest, method, lr, total, weight_decay, self.etdump)
            return
        if et_optimizers.update_in_program(method):  # LOMO, fused: the program updates itself
            from executorch.extension.pybindings.portable_lib import _load_for_executorch

            program = _load_for_executorch(str(directory / PTE), enable_etdump=self.etdump)
            self.module = self.stepper = et_optimizers.UpdatingProgram(
                program, method, self.manifest["trainable_parameters"], lr, total, weight_decay)
            return
        self.module = TrainingProgram(str(directory / PTE), enable_etdump=self.etdump)
        self.update = ProgramUpdate(method.optimizer, lr, total, weight_decay)
        self.stepper = et_optimizers.program_stepper(method, self.module, self.update, lr, total, weight_decay)

    def step(self, batch: dict[str, Any], consume: bool = False) -> float:  # the program reads its inputs whole
        if self.mezo is not None:
            return self.mezo.step(dict(zip(BATCH_INPUTS, _as_inputs(batch))))
        if self.stepper is not None:  # accumN, fused update, LOMO (edgebench.backends.et_optimizers)
            return self.stepper.step(_as_inputs(batch))
        assert isinstance(self.module, TrainingProgram) and self.update is not None  # the plain program step
        loss = self.module.forward_backward(_as_inputs(batch))
        self.update.step(self.module.named_parameters(), self.module.grads)
        return loss

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """The program's trainable weights (for tests and checkpoints)."""
        if self.mezo is not None:
            return dict(zip(self.manifest["trainable_parameters"], self.mezo.params))
        assert self.module is not None, "setup() first"
        return self.module.named_parameters()

    def close(self) -> None:
        self.module = self.update = self.mezo = self.stepper = None


def _program_mezo(directory: Path, manifest: dict[str, Any], method: Any, lr: float, total: int,
                  weight_decay: float, etdump: bool = False) -> ProgramMeZOTrainer:
    """The methods' MeZO trainer, its loss computed by the forward-only program."""
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    from edgebench.methods.mezo import MeZOTrainer
    from edgebench.methods.trainer import Batch

    if manifest.get("program") != "forward-only":
        raise ProgramError(f"{directory}: MeZO needs the forward-only export (made for zeroth-order methods), this "
                           f"is a {manifest.get('program')} program; export it again for this method "
                           f"(`edgebench export --method {getattr(method, 'name', 'mezo')}`)")
    program = _load_for_executorch(str(directory / PTE), enable_etdump=etdump)
    initial = torch.load(directory / TRAINABLE_INIT)
    holder = torch.nn.ParameterList(
        [torch.nn.Parameter(initial[n]) for n in manifest["trainable_parameters"]]
    )

    class ProgramMeZO(MeZOTrainer):
        program: Any

        def loss(self, batch: Batch, consume: bool = False) -> torch.Tensor:  # MeZO reads it twice: kept
            weights = [p.data for p in self.params]  # plain tensors (pybind refuses Parameter)
            inputs = (*(batch[k] for k in BATCH_INPUTS), *weights)
            loss: torch.Tensor = program.run_method("forward", inputs)[0]
            return loss

    trainer = ProgramMeZO(method, holder, lr, total, weight_decay)
    trainer.program = program
    return trainer
