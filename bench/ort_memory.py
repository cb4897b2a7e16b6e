"""Where ONNX Runtime's training memory goes, phase by phase, in one fresh torch-free process.

The ONNX Runtime backend is set up by its own `setup`, and the process's RSS (VmRSS, and the
kernel's peak VmHWM) is read after each of its phases: the runtime imported, the training
session created, the weights read in (with the gradient buffers ORT allocates beside them;
MeZO: the weights, then its eval session), then the first step (Adam's moments, numpy arrays
written from the first update on, with the step's activations and temporaries), then the
peak over all steps. Each phase's growth is its share.

    .venv/bin/python bench/ort_memory.py [--model nanovlm-222m] [--method sgd] [--steps 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys

# Runs in the child: the backend's own setup, its memory read after each phase.
CHILD = r"""
import json, sys, types
from edgebench.backends.onnxruntime import OnnxRuntimeBackend
from edgebench.data.synthetic import synthetic_batches
from edgebench.runner.spec import RunSpec

def rss():
    fields = dict(l.split(":", 1) for l in open("/proc/self/status") if l.startswith(("VmRSS", "VmHWM")))
    return {k: int(v.split()[0]) * 1024 for k, v in fields.items()}

spec = RunSpec.from_dict(json.loads(sys.argv[1]))
manifest = json.load(open(f"{spec.program}/manifest.json"))
phases = [("python + numpy", rss())]
cfg = types.SimpleNamespace(**{k: manifest["model"][k] for k in ("lm_vocab_size", "vit_img_size")})
batches = synthetic_batches(cfg, 1, spec.text_length, 0)
batch = next(batches)
backend = OnnxRuntimeBackend()
backend.setup(spec, batch, on_phase=lambda name: phases.append((name, rss())))
losses = [backend.step(batch)]
phases.append(("first step: optimizer state", rss()))
losses += [backend.step(next(batches)) for _ in range(spec.steps - 1)]
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
    run = dataclasses.replace(spec, program=str(directory), steps=args.steps, warmup_steps=0, threads=2)
    proc = subprocess.run([sys.executable, "-c", CHILD, run.to_json()],
                          capture_output=True, text=True)
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
