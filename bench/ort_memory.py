"""Where ONNX Runtime's training memory goes, phase by phase, in one fresh torch-free process.

The ONNX Runtime backend is set up the way a run sets it up, and the process's RSS (VmRSS,
and the kernel's peak VmHWM) is read after each phase: the runtime imported, the checkpoint
loaded (the weights), the training session created (gradient buffers + session), then the
first step (Adam's moments, numpy arrays written from the first update on, with the step's
activations and temporaries), then the peak over all steps. Each phase's growth is its share.

    .venv/bin/python bench/ort_memory.py [--model nanovlm-222m] [--method sgd] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

# Runs in the child: the backend's own setup, split into its phases.
CHILD = r"""
import json, sys, types
import numpy as np
from edgebench.backends import onnxruntime as ort_backend
from edgebench.backends.numpy_updates import NumpyMeZO, RecipeUpdate
from edgebench.data.synthetic import synthetic_batches

def rss():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM")))
    return {k: int(v.split()[0]) * 1024 for k, v in fields.items()}

directory, steps, text = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
manifest = json.load(open(f"{directory}/manifest.json"))
phases = [("python + numpy", rss())]
api = ort_backend.training_api()
import onnxruntime
ort_backend.return_freed_blocks()
options = ort_backend.session_options(2)
phases.append(("onnxruntime imported", rss()))
state = api.CheckpointState.load_checkpoint(f"{directory}/checkpoint")
phases.append(("checkpoint: weights", rss()))
lr = manifest["default_lr"]
if manifest["program"] == "forward-only":
    forward = ort_backend.ForwardLoss(f"{directory}/eval_model.onnx", state, options)
    mezo = NumpyMeZO([p.data for _, p in state.parameters if p.requires_grad], lr, 0, steps)
    phases.append(("eval session (no gradients)", rss()))
    step = lambda feeds: mezo.step(lambda: forward(feeds))
else:
    module = api.Module(f"{directory}/training_model.onnx", state, None, session_options=options)
    module.train()
    phases.append(("training session + gradient buffers", rss()))
    params = state.parameters
    update = RecipeUpdate(manifest["optimizer"], lambda: [(n, p.data, p.grad) for n, p in params if p.requires_grad],
                          lr, steps)
    def step(feeds):
        loss = module(*feeds)
        update.step()
        module.lazy_reset_grad()
        return float(loss)
cfg = types.SimpleNamespace(**{k: manifest["model"][k] for k in ("lm_vocab_size", "vit_img_size")})
batches = synthetic_batches(cfg, 1, text, 0)
losses = [step(ort_backend._feeds(next(batches)))]
phases.append(("first step: optimizer state", rss()))
losses += [step(ort_backend._feeds(next(batches))) for _ in range(steps - 1)]
phases.append(("step peak: activations + temporaries", rss()))
print(json.dumps({"phases": phases, "losses": losses, "torch": "torch" in sys.modules}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nanovlm-222m")
    parser.add_argument("--method", default="sgd")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--text-length", type=int, default=32)
    args = parser.parse_args()
    from edgebench.runner.spec import RunSpec
    from exporters.pipeline import export_for_spec

    spec = RunSpec(model=args.model, method=args.method, backend="onnxruntime", text_length=args.text_length)
    directory = export_for_spec(spec, on_stage=lambda stage: print(f"  export: {stage}", file=sys.stderr))
    proc = subprocess.run([sys.executable, "-c", CHILD, directory, str(args.steps),
                           str(args.text_length)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the ORT child failed: {proc.stderr.strip().splitlines()[-1:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{args.model}, {args.method}, batch 1, text {args.text_length} (torch imported: {report['torch']})")
    print(f"{'phase':<40}{'RSS MiB':>10}{'+ MiB':>10}{'peak MiB':>10}")
    previous = 0
    for name, figures in report["phases"]:
        rss, peak = figures["VmRSS"], figures["VmHWM"]
        grown = (peak if name.startswith("step peak") else rss) - previous
        print(f"{name:<40}{rss / 2**20:>10,.0f}{grown / 2**20:>10,.0f}{peak / 2**20:>10,.0f}")
        previous = rss
    print(f"losses: {', '.join(f'{x:.4f}' for x in report['losses'])}")


if __name__ == "__main__":
    main()
