"""How nanoVLM main's image splitting changes nanovlm-460m's predicted peak memory (estimates).

Prints, per method, the memory model's prediction for nanovlm-460m with its images as
main trains them (a 2048-px image as 4x4 tiles of 512 px + a global view, 17 x 64 tokens
plus markers) and as one 512-px image (64 tokens) before the text, and their ratio.
All figures are estimates from edgebench.methods.memory, not measurements.

    .venv/bin/python bench/image_tokens.py [--text-length 32] [--batch-size 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from edgebench.methods import memory
from edgebench.model.config import get_config

METHODS = ("adamw", "lora+ckpt+frozen-int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text-length", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=1)
    args = parser.parse_args()
    split = get_config("nanovlm-460m")
    single = dataclasses.replace(split, image_splitting=False)
    rows = []
    for method in METHODS:
        a = memory.predict(split, method, args.batch_size, args.text_length)
        b = memory.predict(single, method, args.batch_size, args.text_length)
        rows.append({"method": method,
                     "split_sequence_length": a["sequence_length"], "single_sequence_length": b["sequence_length"],
                     "split_peak_bytes_est": a["peak_bytes"], "single_peak_bytes_est": b["peak_bytes"],
                     "split_activations_bytes_est": a["activations_bytes"],
                     "single_activations_bytes_est": b["activations_bytes"],
                     "peak_ratio_est": round(a["peak_bytes"] / b["peak_bytes"], 2)})
    print(json.dumps({"model": "nanovlm-460m", "batch_size": args.batch_size, "text_length": args.text_length,
                      "estimate": True, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
