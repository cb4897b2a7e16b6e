"""Method knobs, the named presets, and `parse_method` for `+` combinations.

A method is a set of orthogonal knobs. Each preset or modifier token sets only the knobs it is
about; `parse_method("lora+ckpt+bf16")` merges the tokens, refuses two tokens that set the same
knob differently, fills the rest with defaults, and refuses combinations that cannot work,
with the reason.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from typing import Any

from edgebench.errors import EdgebenchError
from edgebench.methods import optimizers, pruning
from edgebench.untrusted import quote

OPTIMIZERS = tuple(optimizers.OPTIMIZERS)  # each one's descriptor: methods/optimizers.py
GRAD_MODES = ("backprop", "zeroth-order", "forward-mode")
PRECISIONS = ("fp32", "bf16")
TRAINABLE = ("all", "freeze-vision", "lora", "lora-decoder", "bitfit")
LORA_SUBSETS = ("lora", "lora-decoder")  # the subsets that train LoRA adapters
FROZEN_DTYPES = ("fp32", "bf16", "int8", "int4")
TRAINED_DTYPES = ("fp32", "bf16")
ROUNDINGS = ("nearest", "stochastic")

# Optimizers the fused (post-accumulate-grad hook) update can run per parameter.
_FUSABLE = tuple(name for name, o in optimizers.OPTIMIZERS.items() if o.fusable)


class MethodError(EdgebenchError, ValueError):
    """A method text that names an unknown knob or an impossible combination."""


class MethodUnavailable(EdgebenchError, RuntimeError):
    """A valid method that cannot run here (e.g. a library that needs CUDA); says what to do."""


@dataclass(frozen=True)
class Method:
    """One gradient-computation method: the knobs, and the text it was parsed from."""

    optimizer: str = "adamw"
    grad_mode: str = "backprop"
    checkpointing: bool = False  # per transformer block, vision and decoder
    accumulation: int = 1  # micro-batches per step (same effective batch)
    precision: str = "fp32"  # bf16: autocast of the forward (and backward) compute
    trainable: str = "all"
    frozen_dtype: str = "fp32"  # storage of frozen weights: fp32 | bf16 | int8 | int4 (group-wise)
    fused_update: bool = False  # update each parameter in backward, free its grad at once
    trained_dtype: str = "fp32"  # storage of trained weights: fp32 | bf16 (no fp32 master copy)
    rounding: str = "nearest"  # how a bf16 trained weight takes its update: nearest | stochastic
    chunked_loss: bool = False  # cross-entropy over row chunks: no [T, vocab] logits held at once
    # vision encoder + projector one image view at a time (a trained encoder recomputed per view in
    # backward): nanovlm-460m's 17 views' temporaries become one view's; predicted (batch 1)
    # mezo-lora+frozen-int8 temporaries 1,248 -> 512 MiB, peak 2,571 -> 1,651; qlora4 peak 4,040 -> 1,286
    view_by_view: bool = False
    # attention by torch's fused scaled_dot_product_attention (its CPU flash kernel): no
    # [heads, T, T] scores, softmax or their gradients; at nanovlm-460m's 1,137 positions the
    # explicit path's backward holds three 37 MiB (bf16) of them per block
    flash_attention: bool = False
    # sparse backpropagation (PockEngine, Zhu et al. 2023; Lin et al. 2022's sparse update): of
    # what the subset trains, only the decoder's last K blocks train (0: no such limit), so no
    # graph is built below them and backward stops at the first of them
    last_blocks: int = 0
    # pruned fine-tuning (edgebench.methods.pruning): "" none, "magnitude{P}" (P % of each block
    # linear's smallest |w| zeroed) or "2:4"; the zeros are held through training by masks
    prune: str = ""
    name: str = ""

    def knobs(self) -> dict[str, Any]:
        """The knobs alone (without the name), for JSON and tables."""
        out = dataclasses.asdict(self)
        out.pop("name")
        return out

    @property
    def uses_backward(self) -> bool:
        return self.grad_mode == "backprop"

    @property
    def reads_batch_once(self) -> bool:
        """Its step reads the batch in one forward pass (backprop without micro-batches, and not
        cg's line search), so the batch's images can go once that pass is done
        (`Trainer.step(batch, consume=True)`)."""
        return (self.uses_backward and self.accumulation == 1
                and optimizers.optimizer(self.optimizer).trainer != "line-search")

    @property
    def adapts(self) -> bool:
        """Trains LoRA adapters (over every block's linears, or the decoder's only)."""
        return self.trainable in LORA_SUBSETS

    @property
    def vision_frozen(self) -> bool:
        """Nothing in the vision encoder trains: it runs forward only, keeping nothing for backward."""
        return self.trainable in ("freeze-vision", "lora-decoder") or self.last_blocks > 0


# Modifier tokens: combinable with any preset by `+`.
MODIFIERS: dict[str, dict[str, Any]] = {
    "ckpt": {"checkpointing": True},
    "bf16": {"precision": "bf16"},
    "fp32": {"precision": "fp32"},
    "fused": {"fused_update": True},
    "frozen-bf16": {"frozen_dtype": "bf16"},
    "frozen-int8": {"frozen_dtype": "int8"},
    "frozen-int4": {"frozen_dtype": "int4"},
    "bf16-weights": {"trained_dtype": "bf16"},
    "sr": {"rounding": "stochastic"},
    "chunked-ce": {"chunked_loss": True},
    "view-by-view": {"view_by_view": True},
    "flash-attn": {"flash_attention": True},
    "prune2of4": {"prune": pruning.TWO_OF_FOUR},
}
_ACCUM = re.compile(r"accum(\d+)$")
MAX_ACCUMULATION = 1024  # micro-batches per step: accum2000000000 would never finish one step
_LAST = re.compile(r"last(\d+)$")
MAX_LAST_BLOCKS = 1024  # past any decoder's depth; the model's own depth is checked when it is built

# name -> (one-line description, the knobs it sets; the rest are defaults)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("plain SGD, full backprop", {"optimizer": "sgd"}),
    "sgd-momentum": ("SGD with momentum 0.9 (one state tensor)", {"optimizer": "sgd-momentum"}),
    "adam": ("Adam (two fp32 state tensors)", {"optimizer": "adam"}),
    "adamw": ("AdamW as nanoVLM trains: projector lr > backbone lr, cosine, clip 1.0",
              {"optimizer": "adamw"}),
    "adamw-ckpt": ("AdamW + activation checkpointing per transformer block",
                   {"optimizer": "adamw", "checkpointing": True}),
    "adamw-accum4": ("AdamW over 4 micro-batches (same effective batch)",
                     {"optimizer": "adamw", "accumulation": 4}),
    "adamw-bf16": ("AdamW with bf16 autocast", {"optimizer": "adamw", "precision": "bf16"}),
    "adafactor": ("Adafactor: factored second moment (torch.optim.Adafactor)",
                  {"optimizer": "adafactor"}),
    "adamw-8bit": ("AdamW with 8-bit block-quantised states (torchao)",
                   {"optimizer": "adamw-8bit"}),
    "adamw-4bit": ("AdamW with 4-bit block-quantised states (torchao)",
                   {"optimizer": "adamw-4bit"}),
    "galore": ("GaLore: AdamW in a low-rank gradient projection (galore-torch)",
               {"optimizer": "galore"}),
    "lomo": ("LOMO: SGD fused into backward, grads freed at once (lomo-optim)",
             {"optimizer": "lomo"}),
    "adalomo": ("AdaLomo: LOMO with factored adaptive lr (lomo-optim)",
                {"optimizer": "adalomo"}),
    "fused-adamw": ("AdamW applied per parameter in backward (post-accumulate-grad hooks)",
                    {"optimizer": "adamw", "fused_update": True}),
    "lora": ("LoRA r=8 on decoder and vision linears (peft), base frozen",
             {"trainable": "lora"}),
    "lora-ckpt": ("LoRA + activation checkpointing", {"trainable": "lora", "checkpointing": True}),
    "lora-decoder": ("LoRA r=8 on the decoder's linears and the projector; the vision encoder frozen whole",
                     {"trainable": "lora-decoder"}),
    "qlora": ("LoRA over int8 frozen base weights (MeBP recipe), bf16 compute",
              {"trainable": "lora", "frozen_dtype": "int8", "precision": "bf16"}),
    "qlora4": ("LoRA over int4 group-wise frozen weights, checkpointing, chunked cross-entropy",
               {"trainable": "lora", "frozen_dtype": "int4", "precision": "bf16", "checkpointing": True,
                "chunked_loss": True}),
    "lomo-sr": ("full-parameter: bf16 weights, SGD fused into backward with stochastic rounding, "
                "checkpointing, chunked cross-entropy",
                {"optimizer": "sgd", "fused_update": True, "trained_dtype": "bf16", "rounding": "stochastic",
                 "checkpointing": True, "chunked_loss": True}),
    "freeze-vision": ("AdamW with the vision encoder frozen", {"trainable": "freeze-vision"}),
    "sparse-update": ("every weight of the decoder's last 4 blocks, backward stopped below them (sparse "
                      "backpropagation, PockEngine); `lastK` sets another K", {"last_blocks": 4}),
    "prune-magnitude": ("AdamW on the blocks' linears pruned to 50 % by magnitude first, the zeros held (masks); "
                        "`pruneP` sets another P", {"prune": pruning.magnitude(50)}),
    "prune-2of4": ("AdamW on the blocks' linears pruned 2:4 first (2 of every 4 inputs zero), the zeros held",
                   {"prune": pruning.TWO_OF_FOUR}),
    "bitfit": ("train biases (and norms' gains) only", {"trainable": "bitfit"}),
    "mezo": ("MeZO: zeroth-order SPSA, two forwards, no backward (Malladi et al. 2023)",
             {"grad_mode": "zeroth-order"}),
    "mezo-lora": ("MeZO on LoRA parameters only", {"grad_mode": "zeroth-order", "trainable": "lora"}),
    "forward-grad": ("forward gradient: jvp with a random tangent (Baydin et al. 2022)",
                     {"grad_mode": "forward-mode"}),
    "cg": ("nonlinear conjugate gradient (Polak-Ribiere+, Armijo backtracking)",
           {"optimizer": "cg"}),
}


def _token_knobs(token: str) -> dict[str, Any]:
    if token in PRESETS:
        return dict(PRESETS[token][1])
    if token in MODIFIERS:
        return dict(MODIFIERS[token])
    if token in OPTIMIZERS:
        return {"optimizer": token}
    if token in TRAINABLE:
        return {"trainable": token}
    match = _ACCUM.match(token)
    if match:
        digits = match.group(1)
        if len(digits) > len(str(MAX_ACCUMULATION)) or int(digits) > MAX_ACCUMULATION:
            raise MethodError(f"accumN: N is at most {MAX_ACCUMULATION} micro-batches per step, got {quote(digits)}; "
                              "use a smaller N (or a larger --batch-size)")
        return {"accumulation": int(digits)}
    match = _LAST.match(token)
    if match:
        digits = match.group(1)
        if len(digits) > len(str(MAX_LAST_BLOCKS)) or not 1 <= int(digits) <= MAX_LAST_BLOCKS:
            raise MethodError(f"lastK: K is 1 to {MAX_LAST_BLOCKS} decoder blocks, got {quote(digits)}; "
                              "e.g. `lora-decoder+last8`")
        return {"last_blocks": int(digits)}
    match = pruning.PRUNE_TOKEN.match(token)
    if match:
        digits = match.group(1)
        if len(digits) > 2 or not 1 <= int(digits) <= 99:
            raise MethodError(f"pruneP: P is 1 to 99 (% of each weight zeroed), got {quote(digits)}; e.g. `prune50`")
        return {"prune": pruning.magnitude(int(digits))}
    near = difflib.get_close_matches(token, [*PRESETS, *MODIFIERS, *OPTIMIZERS, *TRAINABLE], n=1, cutoff=0.75)
    raise MethodError(
        f"unknown method part {token!r}{f': did you mean {near[0]!r}?' if near else ''} "
        f"Use a preset ({', '.join(PRESETS)}) or a modifier "
        f"({', '.join(MODIFIERS)}, accumN, lastK, pruneP, an optimizer name, a trainable subset); "
        "`edgebench methods` lists them"
    )


def _defaults(knobs: dict[str, Any]) -> dict[str, Any]:
    """Defaults that depend on other knobs: zeroth-order/forward-mode step with SGD; bf16
    trained weights take SGD fused into backward (LOMO's recipe: no optimizer state)."""
    if "optimizer" not in knobs and knobs.get("grad_mode", "backprop") != "backprop":
        knobs["optimizer"] = "sgd"
    if knobs.get("trained_dtype") == "bf16":
        knobs.setdefault("optimizer", "sgd")
        knobs.setdefault("fused_update", True)
    low_precision = knobs.get("frozen_dtype") in ("bf16", "int8", "int4") or knobs.get("trained_dtype") == "bf16"
    if low_precision and "precision" not in knobs:
        knobs["precision"] = "bf16"  # low-precision weights need a bf16 compute path
    return knobs


def _refusal(m: Method) -> str | None:
    """The reason `m` cannot work, or None."""
    if m.grad_mode != "backprop":
        kind = "MeZO" if m.grad_mode == "zeroth-order" else "forward-mode"
        if m.checkpointing:
            return f"{kind} has no backward pass, so there is nothing to checkpoint"
        if m.accumulation > 1:
            return f"{kind} estimates one projected gradient per step; use a larger batch instead of accumN"
        if m.fused_update:
            return f"{kind} has no backward pass to fuse the update into"
        if m.optimizer != "sgd":
            return f"{kind} steps with SGD on its gradient estimate; drop {m.optimizer!r}"
    opt = optimizers.optimizer(m.optimizer)
    if opt.update_in_backward:
        if m.accumulation > 1:
            return (
                f"{m.optimizer} updates each weight inside backward, so gradients cannot accumulate over micro-batches"
            )
        if m.fused_update:
            return f"{m.optimizer} already updates inside backward; drop `fused`"
    if opt.whole_gradient and (m.accumulation > 1 or m.fused_update):
        return f"{m.optimizer} {opt.whole_gradient}: no accumN or fused"
    if m.fused_update:
        if m.optimizer not in _FUSABLE:
            return f"fused update runs one torch optimizer per parameter: {', '.join(_FUSABLE)}; not {m.optimizer!r}"
        if m.accumulation > 1:
            return "fused update frees each gradient as soon as it is applied, so micro-batches cannot accumulate"
    if opt.refuses_lora and m.adapts:
        return opt.refuses_lora
    if m.frozen_dtype != "fp32" and m.trainable == "all":
        return (
            f"frozen-{m.frozen_dtype} stores frozen weights, but nothing is frozen; combine with lora or freeze-vision"
        )
    if m.frozen_dtype != "fp32" and m.trainable == "bitfit":
        return ("frozen low-precision weights with bitfit: the trained fp32 norm gains would meet bf16 "
                "inputs (not supported yet); use lora or freeze-vision")
    if m.frozen_dtype != "fp32" and m.precision != "bf16":
        return f"frozen-{m.frozen_dtype} weights need the bf16 compute path; drop `fp32`"
    if m.trained_dtype == "bf16":
        if m.precision != "bf16":
            return "bf16 trained weights compute in bf16; drop `fp32`"
        if m.grad_mode != "backprop" or not m.fused_update or m.optimizer != "sgd":
            return ("bf16 trained weights are updated by SGD fused into backward (fp32 arithmetic, rounded "
                    "once into bf16); use sgd with `fused` (the defaults), e.g. `all+bf16-weights+sr+ckpt`")
    if m.rounding == "stochastic" and m.trained_dtype != "bf16":
        return "stochastic rounding applies to bf16 trained weights; add `bf16-weights`"
    if m.prune:
        if m.grad_mode != "backprop" or opt.update_in_backward or m.fused_update or opt.trainer == "line-search":
            return ("pruning holds its zeros between the backward and the optimizer's step: use a backprop "
                    "optimizer that steps after backward (sgd, adamw, ...), not fused, LOMO, cg or zeroth-order")
        if m.trainable in ("bitfit", *LORA_SUBSETS) or m.trained_dtype != "fp32":
            return "pruning applies to trained fp32 linear weights: train `all` or `freeze-vision`"
    if m.flash_attention and m.grad_mode == "forward-mode":
        return "flash-attn: torch's fused attention kernel has no forward-mode derivative; drop `flash-attn`"
    if m.chunked_loss and m.grad_mode == "forward-mode":
        return "chunked cross-entropy recomputes logits in backward; forward-mode has none"
    return None


def parse_method(text: str) -> Method:
    """Parse a preset or a `+` combination (`lora+ckpt+bf16`) into a `Method`.

    Raises `MethodError` naming the part that is unknown, the two parts that disagree, or why
    the combination cannot work.
    """
    tokens = [t.strip().lower() for t in text.split("+")]
    if not text.strip() or any(not t for t in tokens):
        raise MethodError(f"empty method part in {text!r}; write e.g. `lora+ckpt+bf16`")
    knobs: dict[str, Any] = {}
    set_by: dict[str, str] = {}
    for token in tokens:
        for key, value in _token_knobs(token).items():
            if key in knobs and knobs[key] != value:
                raise MethodError(
                    f"{text!r}: {set_by[key]!r} sets {key}={knobs[key]!r} but {token!r} sets {value!r}"
                )
            knobs[key] = value
            set_by[key] = token
    method = Method(**_defaults(knobs), name="+".join(tokens))
    if method.accumulation < 1:
        raise MethodError(f"{text!r}: accumN needs N >= 1")
    reason = _refusal(method)
    if reason:
        raise MethodError(f"{text!r} is refused: {reason}")
    return method
