"""`lastK`: only the decoder's last K blocks train, and backward stops at the first of them
(sparse backpropagation), with the same gradients for what trains as a full backward gives.
The exported programs' parity with eager: tests/test_export_methods.py (ExecuTorch, the native
worker's programs) and tests/test_export_onnxruntime.py."""

from __future__ import annotations

import pytest
import torch

from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import MethodError, make_trainer, memory, parse_method
from edgebench.methods.trainer import model_inputs, prepare_model
from edgebench.model import build_model, get_config

DEPTH = get_config("tiny").lm_n_blocks


def _batch() -> dict[str, torch.Tensor]:
    return to_torch(next(synthetic_batches(get_config("tiny"), 2, 16, 0)))


def _prepared(text: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return prepare_model(parse_method(text), build_model("tiny"))


def test_last_k_parses_and_refuses_what_cannot_be():
    assert parse_method("lora-decoder+last8").last_blocks == 8
    assert parse_method("lora-decoder").last_blocks == 0
    for bad in ("last0", "last99999"):
        with pytest.raises(MethodError, match="lastK: K is 1 to"):
            parse_method(f"lora+{bad}")
    with pytest.raises(MethodError, match=f"more decoder blocks than the model has \\({DEPTH}\\)"):
        _prepared(f"lora+last{DEPTH + 1}")


@pytest.mark.parametrize("text", ["all+last1", "lora+last2", "bitfit+last1"])
def test_only_the_last_blocks_train(text):
    method = parse_method(text)
    trained = [n for n, p in _prepared(text).named_parameters() if p.requires_grad]
    assert trained
    allowed = tuple(f"decoder.blocks.{i}." for i in range(DEPTH - method.last_blocks, DEPTH))
    assert all(n.startswith(allowed) for n in trained), trained
    if method.adapts:  # adapters only where they train
        assert all(n.startswith(allowed) for n, _ in _prepared(text).named_parameters() if ".lora_" in n)


def test_backward_stops_at_the_first_trained_block_with_the_full_backwards_gradients():
    batch = _batch()
    sparse = _prepared("all+last1")
    outputs: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda _m, _a, out: outputs.append(out[0] if isinstance(out, tuple) else out))
             for block in sparse.decoder.blocks]
    sparse(*model_inputs(batch)).backward()
    for hook in hooks:
        hook.remove()
    assert [o.requires_grad for o in outputs] == [False] * (DEPTH - 1) + [True]  # no graph below the last block
    trained = {n: p.grad for n, p in sparse.named_parameters() if p.requires_grad}
    assert trained and all(g is not None for g in trained.values())

    full = _prepared("all+last1")
    full.decoder.token_embedding.weight.requires_grad = True  # the graph now runs through every block
    full(*model_inputs(batch)).backward()
    for name, grad in trained.items():
        torch.testing.assert_close(grad, dict(full.named_parameters())[name].grad)


def test_last_k_trains_and_its_loss_falls():
    method = parse_method("all+last2+sgd")
    trainer = make_trainer(method, build_model("tiny"), lr=0.05, total_steps=6)
    batch = _batch()
    losses = [trainer.step(batch) for _ in range(6)]
    assert losses[-1] < losses[0], losses


def test_memory_model_keeps_the_trained_blocks_activations_only():
    full = memory.predict("tiny", "adamw", 16, 32)
    sparse = memory.predict("tiny", "all+last1", 16, 32)
    assert sparse["activations_bytes"] < full["activations_bytes"] / 2
    assert sparse["trainable_params"] < full["trainable_params"] / 4
    with pytest.raises(MethodError, match="more decoder blocks"):
        memory.predict("tiny", f"all+last{DEPTH + 1}", 1, 32)

