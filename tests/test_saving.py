"""`--save`: the trained weights as a nanoVLM checkpoint, and a LoRA run's adapter as peft saves it."""

from __future__ import annotations

import pytest
import torch

from edgebench.data.synthetic import synthetic_batches, to_torch
from edgebench.methods import make_trainer
from edgebench.methods.saving import ADAPTER_CONFIG, ADAPTER_WEIGHTS, save_trained
from edgebench.methods.trainer import build_model_for
from edgebench.model import build_model, get_config
from edgebench.model.checkpoint import from_pretrained, save_pretrained


def _loss(model, batch) -> float:
    with torch.no_grad():
        return model(batch["input_ids"], batch["images"], batch["labels"], batch["attention_mask"]).float().item()


def _trained(method: str, start=None):
    torch.manual_seed(0)
    batch = to_torch(next(synthetic_batches(get_config("tiny"), 1, 16, seed=0)))
    trainer = make_trainer(method, start or build_model_for(method, "tiny"), lr=1e-2, total_steps=2)
    for _ in range(2):
        trainer.step(batch)
    return trainer, batch


# sgd: plain fp32; lora: peft's layers merged; qlora: frozen int8 linears dequantised and merged;
# qlora4: the streamed build's int4 layers; adamw-bf16: bf16 weights widened to fp32.
@pytest.mark.parametrize("method, tolerance", [("sgd", 1e-5), ("lora", 1e-5), ("qlora", 2e-2), ("qlora4", 2e-2),
                                               ("adamw-bf16", 2e-2)])
def test_saved_checkpoint_computes_the_trained_models_loss(tmp_path, method, tolerance):
    trainer, batch = _trained(method)
    with torch.no_grad():
        trained = trainer.loss(batch).float().item()  # in the method's own precision
    save_trained(trainer.model, tmp_path)
    loaded = from_pretrained(tmp_path)  # strict: every nanoVLM key, nothing else
    assert all(t.dtype == torch.float32 for t in loaded.state_dict().values() if t.is_floating_point())
    assert _loss(loaded, batch) == pytest.approx(trained, rel=tolerance)
    assert (tmp_path / ADAPTER_CONFIG).exists() == ("lora" in method)


def test_lora_adapter_loads_with_peft_onto_the_checkpoint_it_started_from(tmp_path):
    """peft's own loader puts the saved adapter on the start checkpoint: the trained model's loss."""
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
    from safetensors.torch import load_file

    torch.manual_seed(0)
    save_pretrained(build_model("tiny"), tmp_path / "start")
    trainer, batch = _trained("lora", start=from_pretrained(tmp_path / "start"))
    save_trained(trainer.model, tmp_path / "saved")
    config = LoraConfig.from_pretrained(str(tmp_path / "saved"))
    base = from_pretrained(tmp_path / "start")
    fresh = _loss(base, batch)
    model = inject_adapter_in_model(config, base)
    prefix = "base_model.model."
    state = {k.removeprefix(prefix): v for k, v in load_file(str(tmp_path / "saved" / ADAPTER_WEIGHTS)).items()}
    assert all(k.startswith(prefix) for k in load_file(str(tmp_path / "saved" / ADAPTER_WEIGHTS)))
    set_peft_model_state_dict(model, state)
    assert _loss(model, batch) == pytest.approx(_loss(trainer.model, batch), rel=1e-5) != pytest.approx(fresh)


def test_saved_weights_are_written_whole_or_not_at_all(tmp_path):
    """A save that fails half-way (a full disk, a bad tensor) leaves no model.safetensors that looks
    saved, and no partial file; a whole one replaces the earlier file in one rename."""
    from edgebench.model.checkpoint import CheckpointError, write_safetensors

    layout = {"a": torch.empty(4, device="meta"), "b": torch.empty(2, 2, device="meta")}
    path = tmp_path / "model.safetensors"

    def failing(name: str) -> torch.Tensor:
        if name == "b":
            raise OSError(28, "No space left on device")
        return torch.ones(4)

    with pytest.raises(OSError, match="No space left"):
        write_safetensors(path, layout, failing)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(CheckpointError, match="b has shape"):
        write_safetensors(path, layout, lambda name: torch.ones(4))
    assert list(tmp_path.iterdir()) == []
    write_safetensors(path, layout, lambda name: torch.ones(layout[name].shape))
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


@pytest.mark.parametrize("target", ["/proc/self", "/proc/self/new/weights"])
def test_save_to_a_folder_we_cannot_write_is_refused_before_any_run(tmp_path, target, edgebench_here):
    done = edgebench_here("bench", "--methods", "sgd", "--save", target, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"{target}: not a folder edgebench can write trained weights into" in lines[0]
    assert not (tmp_path / "runs").exists()
