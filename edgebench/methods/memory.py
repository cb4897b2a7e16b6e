"""The analytic memory model: what a method needs, predicted from the config before it runs.

All figures are estimates (bytes) and say so: every key ends in `_bytes` and the dict carries
`"estimate": True`. Parameter counts come from the real module structure built on torch's meta
device (no memory), with the method's trainable subset applied, so LoRA, BitFit and frozen
storage are counted exactly. Activations kept for backward are counted per transformer block
from the config (the tensors autograd saves in edgebench's nanoVLM, checked with
saved-tensor hooks). The process's runtime baseline (Python, torch and the libraries a method
imports) was measured once on x86_64 Linux, Python 3.11, torch 2.13 CPU; it is a constant, and
dominates the tiny model's peak.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from edgebench.methods import pruning
from edgebench.methods.knobs import Method, parse_method
from edgebench.methods.optimizers import optimizer
from edgebench.methods.subsets import apply_trainable

if TYPE_CHECKING:
    from edgebench.model.config import VLMConfig

MiB = 1 << 20
# Measured once: the runner worker's RSS before it builds the model (torch, numpy,
# edgebench, telemetry imported), and what importing each library adds. Estimates, not
# measurements of the device at hand.
RUNTIME_BASELINE_BYTES_EST = 250 * MiB
# torch imports torch._dynamo (and sympy) the first time a process builds a torch optimizer or
# runs torch.utils.checkpoint's non-reentrant form or forward-mode AD (each wrapped by
# torch._disable_dynamo; edgebench.model.recompute avoids it where it can), or
# imports peft: +70 MiB RSS beside torch alone, less in the worker, whose own imports share
# part of it. The baseline held it (295 MiB) before the meta layouts stopped importing it
# (edgebench.model.layout); without it the worker measures 26 MiB above torch alone (tiny MeZO's
# kernel peak 261 MiB), so 250 + 45 keeps the methods calibrated with it where they were.
TORCH_DYNAMO_BYTES_EST = 45 * MiB
# peft's figure includes the transformers and torchao it imports.
LIBRARY_BASELINE_BYTES_EST = {"peft": 209 * MiB, "torchao": 83 * MiB, "galore_torch": 134 * MiB,
                              "lomo_optim": 19 * MiB}
# What the first backward and optimizer step add beyond the tensors counted here (autograd
# engine's worker threads, allocator arenas): measured once on the tiny model, batch 1.
STEP_RUNTIME_OVERHEAD_BYTES_EST = 25 * MiB
MEZO_CHUNK_ELEMENTS = 1 << 20
# torchao's low-bit AdamW compiles its update per parameter shape (torch.compile, inductor):
# compiling holds a working set (~70 MiB: tiny's step RSS rises 117 MiB with adamw-4bit vs 46
# with adamw) and the first compiled update of a parameter several fp32 copies of it
# (dequantised states, their update, before requantising). Measured: one 108 MiB parameter
# alone, ru_maxrss +790 MiB over its first AdamW4bit step (9 MiB: +111); nanovlm-222m
# adamw-4bit peaks at 3,917 MiB in step 1 (bench/methods.py, loaded host), which 8 copies of
# the largest parameter (the 108 MiB embedding), freed memory kept included, match.
# adamw-8bit's update makes fewer (no nibble unpacking): nanovlm-222m measured 3,651 MiB
# (bench/methods.py --methods adamw-8bit --steps 1), which 5 copies match (8 gave +10.8%).
# (Each optimizer's descriptor, methods/optimizers.py, holds its copies: `update_copies`.)
TORCH_COMPILE_WORKSET_BYTES_EST = 70 * MiB
# Freed activations and temporaries the process keeps resident: glibc serves tensors under its
# (dynamic, up to 32 MiB) mmap threshold from heaps it rarely gives back, and the next step
# reuses the holes imperfectly. Fitted once: 0.25 of the bytes a step makes and frees
# (activations, temporaries; every gradient too where the update runs inside backward) puts
# every measured nanovlm-222m preset and nanovlm-460m lora+ckpt+frozen-int8 within 7%
# (bench/methods.py); MeZO's records are measured apart.
ALLOCATOR_RETAINED_FRACTION_EST = 0.25
# What dequantising one frozen int8/int4 weight makes and frees, bytes a weight (methods.int8:
# bf16 copy and product; methods.int4: unpacked nibbles, their sign fix, bf16 copy and product).
# A block's dequantised layers leave holes between the activations that the heap keeps: the
# freed memory retained is at least one block's worth. Measured: nanovlm-222m qlora4 keeps
# 72 MiB free in its heap after step 1 (mallinfo2; 3 MiB after loading), a vision block's
# 7.1M int4 weights x 8 B = 54 MiB; 8 rather than int4's ~10 made puts nanovlm-222m and -460m
# (--max-image-size 512) qlora4 both within 10%.
DEQUANT_TEMPORARY_BYTES_PER_WEIGHT_EST = {"int8": 4, "int4": 8}
# Attention-probability-sized tensors alive at once in a block's backward (kept softmax, its
# gradient, the scores' gradient).
BACKWARD_ATTENTION_COPIES = 3
# MeZO's restore records (edgebench.methods.exact): ~7.5% of elements need a fix-up, 8 bytes
# each (0.6 B a weight); each weight's chunk records are merged into one (methods.mezo), which
# leaves ~1.8x that resident with the pass's temporaries. Measured: nanovlm-222m's RSS rises
# 249 MiB in the first recorded pass (1,148 -> 1,397 MiB peak, `edgebench bench --model
# nanovlm-222m --methods mezo --warmup 0 --steps 1`) = 1.07 B a trained weight, fitted here;
# a 60 x 1M-weight model rises 61 MiB = 1.07 B too (unmerged it was 4.3 B, 222m 2.44 B).
RESTORE_RECORD_BYTES_PER_WEIGHT_EST = 1.07


@dataclass
class _Param:
    name: str
    shape: tuple[int, ...]
    trainable: bool
    packed: bool  # a frozen linear stored as int8/int4 codes + scales (edgebench.methods.int8, .int4)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@functools.lru_cache(maxsize=64)
def _params(cfg_items: tuple[tuple[str, Any], ...], trainable: str, frozen_dtype: str,
            last_blocks: int = 0) -> tuple[_Param, ...]:
    from edgebench.model.config import VLMConfig
    from edgebench.model.layout import meta_layout
    from edgebench.model.vision_language_model import VisionLanguageModel

    cfg = VLMConfig(**dict(cfg_items))
    with meta_layout():
        model = apply_trainable(Method(trainable=trainable, last_blocks=last_blocks), VisionLanguageModel(cfg))
    # on the meta device apply_trainable adapts the model in place (no peft wrapper)
    decoder = cast(VisionLanguageModel, model).decoder
    tied = {id(decoder.token_embedding.weight)}
    packed: set[int] = set()
    if frozen_dtype in ("int8", "int4"):  # the layers edgebench.methods.int8 / .int4 quantise
        packed = {id(m.weight) for m in model.modules() if type(m) is nn.Linear
                  and not m.weight.requires_grad and id(m.weight) not in tied}
    if frozen_dtype == "int4" and decoder.head.weight is decoder.token_embedding.weight \
            and not decoder.token_embedding.weight.requires_grad:  # int4.pack_tied_embedding
        packed |= tied
    return tuple(_Param(n, tuple(p.shape), p.requires_grad, id(p) in packed)
                 for n, p in model.named_parameters())


def _weights(params: Iterable[_Param], method: Method) -> int:
    from edgebench.methods.int4 import group_size

    total = 0
    for p in params:
        if p.trainable:
            total += (2 if method.trained_dtype == "bf16" else 4) * p.numel
        elif method.frozen_dtype == "fp32":
            total += 4 * p.numel
        elif p.packed and method.frozen_dtype == "int8":  # codes + one fp32 scale a row
            total += p.numel + 4 * p.shape[0]
        elif p.packed:  # two codes a byte + one bf16 scale a group
            total += p.numel // 2 + 2 * p.numel // group_size(p.shape[1])
        else:
            total += 2 * p.numel
    return total


def _optimizer_state(method: Method, trainable: list[_Param]) -> int:
    """The optimizer's state over the trained parameters (its descriptor's `state_bytes`)."""
    state_bytes = optimizer(method.optimizer).state_bytes
    return sum(state_bytes(p.name, p.shape) for p in trainable)


def _block_activation_elements(cfg: VLMConfig, batch: int, text_length: int, images: int,
                               flash: bool) -> dict[str, int]:
    """Elements autograd keeps per transformer block (fp32 model), by vision / decoder.

    The vision encoder sees `images` views at once (every tile of every sample, cfg.n_tiles,
    or one with view-by-view); the decoder sees the whole sequence, image positions included
    (cfg.sequence_length). The softmax kept is a row of scores a position, or with the fused
    kernel (`flash`) one log-sum-exp.
    """
    n = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
    seq = cfg.sequence_length(text_length)
    # ViT block: LN in/out, qkv output, softmax, attention out, LN2 in/out (8 D), MLP (2 I).
    vit = images * n * (8 * cfg.vit_hidden_dim + 2 * cfg.vit_inter_dim + cfg.vit_n_heads * (1 if flash else n))
    # Decoder block: RMSNorm x/x*r/out twice, q, expanded k and v, attention out (10 D),
    # gated MLP (4 I), causal softmax.
    lm = batch * seq * (10 * cfg.lm_hidden_dim + 4 * cfg.lm_inter_dim + cfg.lm_n_heads * (1 if flash else seq))
    return {"vit": vit, "lm": lm, "vit_input": images * n * cfg.vit_hidden_dim,
            "lm_input": batch * seq * cfg.lm_hidden_dim}


def _activations(cfg: VLMConfig, method: Method, batch: int, text_length: int) -> tuple[int, int, int]:
    """(bytes kept for backward, bytes of the largest transient, bytes of the largest transient
    of the forward pass alone), for one micro-batch."""
    elem = 2 if method.precision == "bf16" else 4
    micro = max(1, batch // method.accumulation)
    tiles = micro * cfg.n_tiles
    # through the vision encoder at once: every view, or one under view-by-view
    recomputed = method.view_by_view and method.uses_backward and not method.vision_frozen
    views = tiles if not method.view_by_view else 1
    blocks = _block_activation_elements(cfg, micro, text_length, views, method.flash_attention)
    n = (cfg.vit_img_size // cfg.vit_patch_size) ** 2
    seq = cfg.sequence_length(text_length)
    # The head runs on every position of input_ids but the last (v0.1: the image prefix skipped);
    # chunked-ce projects a chunk of the labelled positions at a time (edgebench.model.loss), and
    # only text is labelled: at most text_length rows.
    head_positions = (seq if cfg.image_splitting else text_length) - 1
    if method.chunked_loss:
        from edgebench.model.loss import CHUNK_ROWS

        head_positions = min(head_positions, text_length, CHUNK_ROWS)
    logits = 4 * micro * head_positions * cfg.lm_vocab_size  # fp32 (autocast keeps CE in fp32)
    # Attention probabilities of one block (the largest tensor in it): the forward holds the
    # scores and their softmax at once, the backward the kept softmax, its gradient and the
    # scores' gradient (3 of them: edgebench's matmul + softmax attention, read off autograd).
    # The fused kernel holds none: its backward's q-sized gradients and accumulators are the
    # block's (measured: 12 MiB over 15 heads x 1,137 positions in bf16, against 153 explicit).
    scores = 0 if method.flash_attention else 1
    vit_scores = scores * views * cfg.vit_n_heads * n * n
    lm_scores = scores * micro * cfg.lm_n_heads * seq * seq
    # A frozen or gradient-free encoder under view-by-view runs before the decoder holds anything
    # (a phase of its own); otherwise the largest block's temporaries are counted. That phase runs
    # block by block (ViT.views_block_by_block): every view's hidden state, one view's block
    # temporaries, and the block's frozen int8/int4 weights dequantised once for all the views.
    # The projector's frozen layer dequantises once too, as the first view leaves the encoder.
    vision_apart = method.view_by_view and not recomputed
    packed = method.frozen_dtype in ("int8", "int4")
    # q, k, v, out, fc1, fc2
    held = elem * 4 * cfg.vit_hidden_dim * (cfg.vit_hidden_dim + cfg.vit_inter_dim // 2) if packed else 0
    projector = cfg.vit_hidden_dim * cfg.mp_pixel_shuffle_factor**2 * cfg.lm_hidden_dim
    if method.frozen_dtype == "int4":  # the weight, then its parts' temporaries one part at a time
        from edgebench.methods.int4 import PART_ELEMENTS

        dequantised = elem * projector + DEQUANT_TEMPORARY_BYTES_PER_WEIGHT_EST["int4"] * min(projector, PART_ELEMENTS)
    else:
        dequantised = DEQUANT_TEMPORARY_BYTES_PER_WEIGHT_EST.get(method.frozen_dtype, 0) * projector
    vit_phase = elem * tiles * blocks["vit_input"] + max(elem * (blocks["vit"] + vit_scores) + held, dequantised) \
        if vision_apart else 0
    largest_block = elem * (blocks["lm"] if vision_apart else max(blocks["vit"], blocks["lm"]))
    attention = elem * (lm_scores if vision_apart else max(vit_scores, lm_scores))
    transient = largest_block + 2 * logits
    if not method.uses_backward:
        return 0, max(transient, vit_phase), max(transient, vit_phase)
    forward = transient
    vision_frozen = method.vision_frozen
    # lastK: the blocks below the trained ones build no graph (nor the projector under them)
    lm_blocks = method.last_blocks or cfg.lm_n_blocks
    # view-by-view keeps only each view's input and output of a trained encoder (checkpoint).
    # Measured (tiny in main's layout at 256-px tiles, 10 views, batch 2, loaded host): kernel
    # peak sgd 539 MiB vs 553 predicted, lora 672 vs 756, freeze-vision 470 vs 494.
    if method.checkpointing:  # block inputs only, and one block recomputed at a time
        vit = 0 if vision_frozen or recomputed else cfg.vit_n_blocks * blocks["vit_input"] * elem
        lm = lm_blocks * blocks["lm_input"] * elem
        transient = max(transient, largest_block + BACKWARD_ATTENTION_COPIES * attention + 2 * logits)
    else:
        vit = 0 if vision_frozen or recomputed else cfg.vit_n_blocks * blocks["vit"] * elem
        lm = lm_blocks * blocks["lm"] * elem
        transient = max(transient, (BACKWARD_ATTENTION_COPIES - 1) * attention + 2 * logits)
    if recomputed:  # one view's encoder runs again inside backward and back-propagates
        view_kept = cfg.vit_n_blocks * blocks["vit_input"] + blocks["vit"] if method.checkpointing \
            else cfg.vit_n_blocks * blocks["vit"]
        transient = max(transient, elem * (view_kept + BACKWARD_ATTENTION_COPIES * vit_scores) + 2 * logits)
    # encoder outputs kept: for the final norm and the projector, or a frozen encoder's for the projector
    vit_out = 0 if method.last_blocks else (views if recomputed else tiles) * (1 if vision_frozen else 2)
    extras = elem * (vit_out * n * cfg.vit_hidden_dim + micro * seq * 3 * cfg.lm_hidden_dim) + logits
    kept = vit + lm + extras
    return kept, max(transient, vit_phase - kept), max(forward, vit_phase - kept)


def _dequantised_block(params: Iterable[_Param], method: Method, per_layer: bool = False,
                       skip: tuple[str, ...] = ()) -> int:
    """Bytes the dequantisation of one block's frozen int8/int4 linears makes and frees (the
    largest block's; `per_layer`: the largest layer's), of the parameters not named `skip...`."""
    from edgebench.methods.int4 import HEAD_ROWS

    per_weight = DEQUANT_TEMPORARY_BYTES_PER_WEIGHT_EST.get(method.frozen_dtype, 0)
    blocks: dict[str, int] = {}
    for p in params:
        if p.packed and not p.name.startswith(skip):
            block = p.name if per_layer else re.sub(r"(\.\d+)\..*$", r"\1", p.name)  # up to the block's index
            # the tied int4 head dequantises HEAD_ROWS vocabulary rows at a time
            numel = min(p.numel, HEAD_ROWS * p.shape[1]) if "token_embedding" in p.name else p.numel
            blocks[block] = blocks.get(block, 0) + numel
    return per_weight * max(blocks.values(), default=0)


def _streamed(method: Method) -> bool:
    """Built layer by layer on the meta device (edgebench.methods.trainer.build_model_for):
    LoRA without peft. (Its mmap of blocks >= 1 MiB leaves smaller ones in the heap: the
    retained fraction stays; nanovlm-222m qlora4 measured 651 MiB, more than even that.)"""
    return method.frozen_dtype == "int4"


def _libraries(method: Method) -> list[str]:
    libs: list[str] = []
    if method.adapts and not _streamed(method):
        libs.append("peft")
    library = optimizer(method.optimizer).library
    if library and not (library == "torchao" and "peft" in libs):  # peft's figure includes torchao
        libs.append(library)
    return libs


def _imports_dynamo(method: Method, trainable: list[_Param]) -> bool:
    """Whether training imports torch._dynamo (TORCH_DYNAMO_BYTES_EST): MeZO over the streamed
    build, cg's line search, bf16 weights' SGD, and recomputation whose parameters are used
    once (edgebench.model.recompute) never do; a trained encoder recomputed view by view, or a
    trained head over the loss's chunks, recompute through torch's own checkpoint."""
    if "peft" in _libraries(method) or method.grad_mode == "forward-mode":
        return True
    if not method.uses_backward:
        return False
    in_house = optimizer(method.optimizer).trainer == "line-search" or method.trained_dtype == "bf16"
    head_trains = any(p.name.startswith("decoder.head") or "token_embedding" in p.name for p in trainable)
    shared = (method.chunked_loss and head_trains) or (method.view_by_view and not method.vision_frozen)
    return not in_house or shared


def _update_transient(method: Method, trainable: list[_Param]) -> int:
    """The largest temporary the update makes, one parameter at a time (torch's optimizers run
    their single-tensor path on CPU: no foreach over all parameters). Updates fused into
    backward run beside the activations, except the token embedding's: its gradient completes
    last (the lookup is the forward's first op), after every activation is freed."""
    during = [p for p in trainable if not (method.fused_update and "token_embedding" in p.name)]
    largest = 4 * max(p.numel for p in (during or trainable))
    opt = optimizer(method.optimizer)
    if method.grad_mode != "backprop" or not opt.update_copies:
        if method.trained_dtype == "bf16":  # fp32 copies of one chunk: weight, gradient, noise
            from edgebench.methods.bf16 import CHUNK

            return 4 * 4 * CHUNK
        return 0
    # Adam's denom = exp_avg_sq.sqrt() / bias_correction2_sqrt (two at once), GaLore's projected-back
    # update beside its AdamW denom, one full-size temporary for Adafactor's and AdaLomo's, the
    # torchao update's fp32 copies of a parameter (see TORCH_COMPILE_WORKSET_BYTES_EST)
    workset = TORCH_COMPILE_WORKSET_BYTES_EST if opt.compiled_update else 0
    return workset + int(opt.update_copies * largest)


def _load_peak(params: tuple[_Param, ...], method: Method, weights: int, cfg: VLMConfig) -> int:
    """Bytes above the bare runtime while edgebench.methods.trainer.build_model_for builds the
    model and make_trainer converts it (the libraries a method imports load in between)."""
    total = sum(p.numel for p in params)
    libraries = sum(LIBRARY_BASELINE_BYTES_EST[lib] for lib in _libraries(method))
    head = cfg.lm_vocab_size * cfg.lm_hidden_dim  # the untied head, made then dropped by tying
    largest_frozen = max((p.numel for p in params if p.packed and "token_embedding" not in p.name), default=0)
    if _streamed(method):  # each module made in its final dtype; a frozen linear then packed:
        # its bf16 weight, fp32 groups, codes; the tied embedding is packed last, from bf16, a few
        # thousand rows at a time (int4.PART_ELEMENTS)
        embedding = max((2 * p.numel for p in params if p.packed and "token_embedding" in p.name), default=0)
        return libraries + weights + max(6 * largest_frozen, embedding)
    build = 2 if method.frozen_dtype != "fp32" or method.trained_dtype != "fp32" else 4
    return max(build * (total + head), libraries + build * total + 4 * largest_frozen)  # int8: one fp32 copy


def predict(cfg: VLMConfig | str, method: Method | str, batch_size: int, text_length: int,
            image_size: int | None = None) -> dict[str, int]:
    """Predicted memory of one training step (bytes, estimates) and its peak.

    Keys: weights, gradients (tangents for forward-mode; gradient + previous gradient for cg),
    optimizer_state, prune_masks (a pruned method's), activations (kept for backward), temporaries (largest transient),
    allocator_retained (freed memory the C allocator keeps resident), batch (the step's inputs),
    runtime_baseline
    (Python + torch + libraries), load_peak (building the model first),
    peak; each `<name>_bytes`, plus `"estimate": True`, and the shape they follow:
    `sequence_length` (decoder positions a sample takes, image included) and `image_tiles`
    (images the vision encoder sees per sample).
    """
    if isinstance(cfg, str):
        from edgebench.model.config import get_config

        cfg = get_config(cfg)
    if isinstance(method, str):
        method = parse_method(method)
    opt = optimizer(method.optimizer)
    cfg = cfg.with_image_size(image_size)
    params = _params(tuple(sorted(cfg.to_dict().items())), method.trainable, method.frozen_dtype, method.last_blocks)
    trainable = [p for p in params if p.trainable]
    n_trainable = sum(p.numel for p in trainable)
    weights = _weights(params, method)
    grad_elem = 2 if method.trained_dtype == "bf16" else 4
    largest = grad_elem * max(p.numel for p in trainable)

    if method.grad_mode == "zeroth-order":
        gradients = 0
    elif method.grad_mode == "forward-mode":
        gradients = 4 * n_trainable  # one tangent per trainable weight
    elif method.fused_update and method.trained_dtype == "bf16":
        gradients = largest  # one at a time; the embedding's lookup gradient is sparse (methods.bf16)
    elif method.fused_update or opt.update_in_backward:
        gradients = 2 * largest  # at most a couple of gradients alive at once
    else:
        gradients = opt.gradient_copies * grad_elem * n_trainable  # cg: this step's and the previous one
    state = 0 if method.grad_mode != "backprop" else _optimizer_state(method, trainable)
    masks = sum(p.numel for p in trainable if method.prune and pruning.prunable(p.name, p.shape))  # bool, a byte each
    activations, temporaries, forward_temporaries = _activations(cfg, method, batch_size, text_length)
    temporaries += _update_transient(method, trainable)
    if method.grad_mode == "zeroth-order":
        # a forward-only step peaks inside a layer: its dequantised weight beside the block's
        # temporaries, one layer at a time (measured, 1 GiB lab devices: nanovlm-460m VLM_1GIB_MEZO
        # 871 MiB, 767 predicted without this term; nanovlm-222m's 451 MiB, 503 predicted when
        # the term counted a whole vision block). Under view-by-view the encoder's and projector's
        # are counted in their own phase (_activations).
        apart = ("vision_encoder.", "MP.") if method.view_by_view else ()
        temporaries += int(RESTORE_RECORD_BYTES_PER_WEIGHT_EST * n_trainable) + _dequantised_block(
            params, method, per_layer=True, skip=apart)
    if method.grad_mode == "forward-mode":
        temporaries *= 2  # every forward temporary carries its tangent
    if method.uses_backward:
        temporaries += opt.step_copies * 4 * n_trainable  # cg: the new direction while the old one is alive
    records = int(RESTORE_RECORD_BYTES_PER_WEIGHT_EST * n_trainable) if method.grad_mode == "zeroth-order" else 0
    churned = activations + temporaries - records
    if method.uses_backward and (method.fused_update or opt.update_in_backward):
        churned += grad_elem * n_trainable  # each gradient made and freed inside backward
    # A forward-only step under view-by-view dequantises each frozen layer once, between no kept
    # activations: no block-sized holes (nanovlm-460m VLM_1GIB_MEZO: 26 MiB free in glibc's heap
    # after a step, mallinfo2).
    holes = 0 if method.grad_mode == "zeroth-order" and method.view_by_view else _dequantised_block(params, method)
    allocator = max(int(ALLOCATOR_RETAINED_FRACTION_EST * churned), holes)
    dynamo = TORCH_DYNAMO_BYTES_EST if _imports_dynamo(method, trainable) else 0
    baseline = RUNTIME_BASELINE_BYTES_EST + dynamo + sum(LIBRARY_BASELINE_BYTES_EST[lib] for lib in _libraries(method))
    if method.uses_backward:
        baseline += STEP_RUNTIME_OVERHEAD_BYTES_EST
    # the step's batch: fp32 pixels of every view (nanovlm-460m at main's images: 17 x 3 x 512 x
    # 512, 51 MiB), token ids, labels and mask; a step that reads it in one forward pass drops the
    # pixels when that pass is done (Trainer.step's `consume`), so backward runs without them,
    # unless autograd saved them: for the trained patch embedding's weight, or as the views a
    # trained encoder recomputes one by one
    images = batch_size * 4 * cfg.n_tiles * 3 * cfg.vit_img_size**2
    batch = images + batch_size * 3 * 8 * text_length
    train_peak = baseline + weights + gradients + state + masks + activations + temporaries + allocator + batch
    saved = not method.vision_frozen and (method.trainable == "all" or method.view_by_view)
    if method.reads_batch_once and not saved:
        forward_peak = baseline + weights + state + masks + activations + forward_temporaries + allocator + batch
        train_peak = max(train_peak - images, forward_peak)
    # the first batch is made before the model (edgebench.runner.worker) and alive while it loads
    load_peak = RUNTIME_BASELINE_BYTES_EST + dynamo + _load_peak(params, method, weights, cfg) + batch
    return {
        "weights_bytes": weights,
        "gradients_bytes": gradients,
        "optimizer_state_bytes": state,
        "prune_masks_bytes": masks,
        "activations_bytes": activations,
        "temporaries_bytes": temporaries,
        "allocator_retained_bytes": allocator,
        "batch_bytes": batch,
        "runtime_baseline_bytes": baseline,
        "load_peak_bytes": load_peak,
        "peak_bytes": max(train_peak, load_peak),
        "trainable_params": n_trainable,
        "total_params": sum(p.numel for p in params),
        "sequence_length": cfg.sequence_length(text_length),
        "image_tiles": cfg.n_tiles,
        "estimate": True,
    }
