"""Issue 29's benchmark: every preset each exported runtime runs, beside the same method in eager.

The runtimes are the backends other than eager (`edgebench.backends.support.BACKEND_NAMES`),
and each one's presets (and the combinations `edgebench predict` ranks beside them) are
those `support.unsupported_reason` lets through, so the list grows with the support table.
Per preset, one interleaved run (bench/backends.py's `bench_model`: each round starts one
fresh process per variant in turn, eager first, so load from other work hits all alike)
gives, per runtime: median step time and peak RSS (VmHWM) as ratios to eager, the export
time and planned memory from the export's manifest, and the largest relative loss difference
from eager over the measured steps (warmup steps left out). ExecuTorch runs in its Python
runtime, XNNPACK-delegated by default (the device profiles' lowering; `--delegate none` for
the runtime's own kernels). MeZO on ONNX Runtime draws its directions with numpy, eager with
torch: its losses are not comparable step for step (marked "z differs"). Export time is each
export's own: a program shared between methods (ORT's SGD/Adam/AdamW artifacts, ExecuTorch's
program for the updates between calls) is lowered by whichever exports first, and the others
only link it.

    .venv/bin/python bench/exported.py --model tiny --presets sgd,lora --steps 3
    .venv/bin/python bench/exported.py --model nanovlm-222m --json exported.json   # all presets: hours
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# bench/backends.py: the interleaved runs, exports and ratios
from backends import VARIANTS, add_run_options, bench_model, chosen

from edgebench.backends.support import BACKEND_NAMES, unsupported_reason
from edgebench.methods import PRESETS, parse_method
from edgebench.methods.fit import COMBINATIONS

RUNTIMES = tuple(b for b in BACKEND_NAMES if b != "eager")


def variant_for(runtime: str, delegate: str | None) -> str:
    """bench/backends.py's variant that runs `runtime` (ExecuTorch: with or without XNNPACK)."""
    name = f"{runtime}-{delegate}" if runtime == "executorch" and delegate else runtime
    if name not in VARIANTS:
        raise SystemExit(f"bench/backends.py has no variant {name!r} for runtime {runtime!r}")
    return name


def plan(presets: list[str], runtimes: list[str]) -> dict[str, list[str]]:
    """{preset: the runtimes that run it}, presets no runtime runs left out."""
    out = {}
    for name in presets:
        method = parse_method(name)
        runs = [r for r in runtimes if unsupported_reason(method, r) is None]
        if runs:
            out[name] = runs
    return out


def measure(model: str, presets: dict[str, list[str]], delegate: str | None, rounds: int, steps: int,
            warmup: int, text_length: int, threads: int | None) -> list[dict]:
    rows = []
    for preset, runtimes in presets.items():
        variants = {variant_for(r, delegate): r for r in runtimes}
        batch = parse_method(preset).accumulation  # 1, or accumN's N micro-batches of one
        try:
            measured = bench_model(model, preset, ["eager", *variants], rounds, steps, warmup, text_length, threads,
                                   batch)
        except Exception as exc:  # an export that fails: the other presets still run
            rows += [{"preset": preset, "runtime": r, "error": f"{type(exc).__name__}: {exc}"} for r in runtimes]
            continue
        eager = measured["eager"]
        for name, runtime in variants.items():
            row = measured[name]
            mine, base = (row["losses"] or [None])[0], (eager["losses"] or [None])[0]
            diff = (max(abs(x - y) / abs(y) for x, y in zip(mine[warmup:], base[warmup:]))
                    if mine and base else None)
            rows.append({
                "preset": preset, "runtime": runtime, "variant": name, "batch_size": batch,
                "error": row["error"] or eager["error"],
                "step_s": row["median_step_s"], "eager_step_s": eager["median_step_s"],
                "step_time_vs_eager": row["median_step_s_vs_eager"],
                "peak_rss_bytes": row["peak_rss_bytes"], "eager_peak_rss_bytes": eager["peak_rss_bytes"],
                "peak_rss_vs_eager": row["peak_rss_bytes_vs_eager"],
                "export_time_s": row["export_time_s"], "export_cached": row["export_cached"],
                "planned_memory_bytes": row["planned_memory_bytes"],
                "max_loss_rel_diff": diff,
                "losses_comparable": not (runtime == "onnxruntime"
                                          and parse_method(preset).grad_mode == "zeroth-order"),
                "losses": mine, "eager_losses": base,
            })
    return rows


def render(rows: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("preset", "runtime", "step x eager", "peak RSS x eager", "export s", "planned MiB",
                "loss vs eager", "note"):
        table.add_column(col, justify="left" if col in ("preset", "runtime", "note") else "right")

    def fmt(value, scale=1.0, digits=2):
        return "-" if value is None else f"{value / scale:.{digits}f}"

    for r in rows:
        if r.get("error") and r.get("step_s") is None:
            table.add_row(r["preset"], r["runtime"], "-", "-", "-", "-", "-", r["error"][:80])
            continue
        diff = "-" if r["max_loss_rel_diff"] is None else f"{r['max_loss_rel_diff']:.1e}"
        note = "; ".join(n for n in (r.get("error") or "", "" if r["losses_comparable"] else "z differs",
                                     "export cached" if r["export_cached"] else "") if n)
        table.add_row(r["preset"], r["runtime"], fmt(r["step_time_vs_eager"]), fmt(r["peak_rss_vs_eager"]),
                      fmt(r["export_time_s"], digits=1), fmt(r["planned_memory_bytes"], 2**20, 1), diff, note)
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--presets", default=None,
                        help="Comma-separated presets and combinations (default: every one a runtime runs).")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"Comma-separated, of {', '.join(RUNTIMES)}.")
    parser.add_argument("--delegate", default="xnnpack", choices=("xnnpack", "none"),
                        help="ExecuTorch's lowering (default: the device profiles' XNNPACK).")
    parser.add_argument("--rounds", type=int, default=1, help="Interleaved rounds per preset (default 1).")
    add_run_options(parser)
    args = parser.parse_args()
    runtimes = chosen(parser, args.runtimes, RUNTIMES, "runtime(s)")
    known = [*PRESETS, *COMBINATIONS]
    presets = chosen(parser, args.presets, known, "preset(s)") if args.presets else known
    planned = plan(presets, runtimes)
    skipped = sorted(set(presets) - set(planned))
    if skipped:
        print(f"no exported runtime runs: {', '.join(skipped)}", file=sys.stderr)
    delegate = None if args.delegate == "none" else args.delegate
    rows = measure(args.model, planned, delegate, args.rounds, args.steps, args.warmup, args.text_length,
                   args.threads)
    render(rows, f"{args.model}, batch 1 (accumN: N), text {args.text_length}: exported runtimes vs eager "
                 f"({args.rounds} interleaved round(s), {args.steps} measured steps)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"model": args.model, "steps": args.steps, "warmup": args.warmup,
                                                   "text_length": args.text_length, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
