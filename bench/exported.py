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
the runtime's own kernels). A method that computes in bf16 gets two ExecuTorch rows with
XNNPACK: its values rounded to bf16 where eager rounds (eager's values), and "fp32" (export
bf16 "fp32": computed in fp32, unrounded; faster, and its losses off eager's by bf16's
rounding); `--bf16` picks. MeZO on ONNX Runtime draws its directions with numpy, eager with
torch: its losses are not comparable step for step (marked "z differs"). Export time is each
export's own: a program shared between methods (ORT's SGD/Adam/AdamW artifacts, ExecuTorch's
program for the updates between calls) is lowered by whichever exports first, and the others
only link it.

    .venv/bin/python bench/exported.py --model tiny --presets sgd,lora --steps 3
    .venv/bin/python bench/exported.py --model nanovlm-222m --json exported.json   # all presets: ~40 min

`--json FILE` is written after each preset; run again with the same settings and FILE, it
measures only the presets FILE lacks (or that failed). Each export runs in a fresh process.
`--from-json F1 F2 ...` prints the table of earlier runs, a later file's rows of a preset in
place of an earlier one's (a preset measured again over more rounds).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

# bench/backends.py: the interleaved runs, exports and ratios
from backends import VARIANTS, add_run_options, bench_model, chosen

from edgebench.backends.support import BACKEND_NAMES, unsupported_reason
from edgebench.methods import PRESETS, parse_method
from edgebench.methods.fit import COMBINATIONS
from exporters.manifest import BF16_MODES

RUNTIMES = tuple(b for b in BACKEND_NAMES if b != "eager")


def variants_for(runtime: str, delegate: str | None, bf16_modes: list[str], computes_in_bf16: bool) -> list[str]:
    """bench/backends.py's variants that run `runtime` (ExecuTorch: with or without XNNPACK;
    with it, a bf16 method once per mode of `bf16_modes`)."""
    name = f"{runtime}-{delegate}" if runtime == "executorch" and delegate else runtime
    if name not in VARIANTS:
        raise SystemExit(f"bench/backends.py has no variant {name!r} for runtime {runtime!r}")
    if name != "executorch-xnnpack" or not computes_in_bf16:
        return [name]
    return [name if mode == "rounded" else f"{name}-{mode}" for mode in bf16_modes]


def plan(presets: list[str], runtimes: list[str]) -> dict[str, list[str]]:
    """{preset: the runtimes that run it}, presets no runtime runs left out."""
    out = {}
    for name in presets:
        method = parse_method(name)
        runs = [r for r in runtimes if unsupported_reason(method, r) is None]
        if runs:
            out[name] = runs
    return out


def measure(model: str, presets: dict[str, list[str]], delegate: str | None, bf16_modes: list[str], rounds: int,
            steps: int, warmup: int, text_length: int, threads: int | None,
            on_preset: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """The rows of every preset; `on_preset(rows so far)` after each one (the --json file is
    written there, so a sweep stopped midway keeps what it measured)."""
    rows: list[dict] = []
    for preset, runtimes in presets.items():
        on_preset(rows)
        method = parse_method(preset)
        in_bf16 = method.precision == "bf16"
        variants = {v: r for r in runtimes for v in variants_for(r, delegate, bf16_modes, in_bf16)}
        batch = method.accumulation  # 1, or accumN's N micro-batches of one
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
                "bf16": VARIANTS[name][3] if in_bf16 and runtime == "executorch" else None,
                "error": row["error"] or eager["error"],
                "step_s": row["median_step_s"], "eager_step_s": eager["median_step_s"],
                "step_time_vs_eager": row["median_step_s_vs_eager"],
                "peak_rss_bytes": row["peak_rss_bytes"], "eager_peak_rss_bytes": eager["peak_rss_bytes"],
                "peak_rss_vs_eager": row["peak_rss_bytes_vs_eager"],
                "export_time_s": row["export_time_s"], "export_cached": row["export_cached"],
                "planned_memory_bytes": row["planned_memory_bytes"],
                "max_loss_rel_diff": diff,
                "losses_comparable": not (runtime == "onnxruntime"
                                          and method.grad_mode == "zeroth-order"),
                "losses": mine, "eager_losses": base,
            })
    on_preset(rows)
    return rows


# Issue 29's targets: step and peak RSS as ratios to eager, export seconds (SGD's program
# sooner), and the largest relative loss difference: 1e-5 for fp32 methods; for methods that
# round to bf16 or int8 where eager rounds, 5e-3 (bf16 keeps 8 bits, a relative step of 2^-8
# = 3.9e-3 between neighbours, and XNNPACK sums in other orders before each rounding, so a
# value can land one bf16 step away: 2.0e-3 measured over 3 steps of adamw-bf16 on 222m;
# tests/test_export_methods.py bounds it on micro); zeroth-order methods that round, 1e-2
# (MeZO's step is the difference of two such losses over 2 eps = 2e-3: the forwards' rounding
# difference, 1.9e-5 of the loss, comes out ~500x larger in its update).
STEP_TARGET, PEAK_TARGET, EXPORT_TARGET_S, SGD_EXPORT_TARGET_S = 1.5, 1.1, 180.0, 120.0
FP32_LOSS_TARGET, ROUNDED_LOSS_TARGET, ROUNDED_ZEROTH_ORDER_LOSS_TARGET = 1e-5, 5e-3, 1e-2


def missed(row: dict) -> list[str]:
    """The targets a measured row misses, by name."""
    method = parse_method(row["preset"])
    loss_target = (FP32_LOSS_TARGET if method.precision != "bf16" else
                   ROUNDED_ZEROTH_ORDER_LOSS_TARGET if method.grad_mode == "zeroth-order" else ROUNDED_LOSS_TARGET)
    limits = [("step", row["step_time_vs_eager"], STEP_TARGET),
              ("peak", row["peak_rss_vs_eager"], PEAK_TARGET),
              ("export", None if row["export_cached"] else row["export_time_s"],
               SGD_EXPORT_TARGET_S if row["preset"] == "sgd" else EXPORT_TARGET_S),
              ("loss", row["max_loss_rel_diff"] if row["losses_comparable"] else None, loss_target)]
    return [name for name, value, limit in limits if value is not None and value > limit]


COLUMNS = ("preset", "runtime", "step x eager", "peak RSS x eager", "export s", "planned MiB", "loss vs eager",
           "over target; note")


SHORT_HEADERS = {"runtime": "run-\ntime", "step x eager": "step\nx eager", "peak RSS x eager": "peak\nx eager",
                 "export s": "export\ns", "planned MiB": "planned\nMiB", "loss vs eager": "loss vs\neager",
                 "over target; note": "over target;\nnote"}
SHORT_RUNTIMES = {"executorch": "ET", "onnxruntime": "ORT"}
CAPTION = "ET: ExecuTorch, ORT: ONNX Runtime; fp32: a bf16 method's values in fp32, unrounded"


def runtime_name(row: dict, short: bool = False) -> str:
    """The row's runtime, "fp32" after it for a bf16 method computed unrounded."""
    name = SHORT_RUNTIMES.get(row["runtime"], row["runtime"]) if short else row["runtime"]
    return f"{name} fp32" if row.get("bf16") == "fp32" else name


def cells(row: dict) -> list[str]:
    """One row's table cells (COLUMNS)."""
    def fmt(value, scale=1.0, digits=2):
        return "-" if value is None else f"{value / scale:.{digits}f}"

    if row.get("error") and row.get("step_s") is None:
        return [row["preset"], runtime_name(row), "-", "-", "-", "-", "-", row["error"][:80]]
    diff = "-" if row["max_loss_rel_diff"] is None else f"{row['max_loss_rel_diff']:.1e}"
    note = "; ".join(n for n in (row.get("error") or "", "" if row["losses_comparable"] else "z differs",
                                 "export cached" if row["export_cached"] else "") if n)
    return [row["preset"], runtime_name(row), fmt(row["step_time_vs_eager"]), fmt(row["peak_rss_vs_eager"]),
            fmt(row["export_time_s"], digits=1), fmt(row["planned_memory_bytes"], 2**20, 1), diff,
            "; ".join(n for n in (", ".join(missed(row)), note) if n) or "-"]


def render(rows: list[dict], title: str, markdown: bool = False) -> None:
    """The rows as a rich table, or (`markdown`) as docs/measurements.md's Markdown table."""
    if markdown:
        right = [c not in ("preset", "runtime", "over target; note") for c in COLUMNS]
        print(f"{title}\n\n| {' | '.join(COLUMNS)} |\n|{'|'.join('---:' if r else '---' for r in right)}|")
        for row in rows:
            print(f"| {' | '.join(cells(row))} |")
        return
    from rich.console import Console
    from rich.table import Table

    # Narrow headers and runtimes for a terminal (80 columns): figures stay whole, names fold.
    table = Table(title=title, caption=CAPTION, show_edge=False, padding=(0, 0, 0, 1))
    for col in COLUMNS:
        text = col in ("preset", "over target; note")
        table.add_column(SHORT_HEADERS.get(col, col), justify="left" if text or col == "runtime" else "right",
                         overflow="fold", no_wrap=not text, min_width=13 if col == "preset" else None)
    for row in rows:
        preset, _, *rest = cells(row)
        table.add_row(preset, runtime_name(row, short=True), *rest)
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def title(model: str, text_length: int, rounds: int | str, steps: int) -> str:
    return (f"{model}, batch 1 (accumN: N), text {text_length}: exported runtimes vs eager "
            f"({rounds} interleaved round(s), {steps} measured steps)")


def merged_runs(parser: argparse.ArgumentParser, paths: list[str]) -> tuple[list[dict], str]:
    """The rows of earlier runs' --json files, a later file's rows of a preset in place of an
    earlier one's (a preset measured again, e.g. over more rounds), and the title. The runs must
    share model, text length, steps and warmup (else a usage error naming the file)."""
    by_preset: dict[str, list[dict]] = {}  # a preset measured again keeps its place
    rounds: dict[str, str] = {}
    first: dict = {}
    for path in paths:
        try:
            run = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--from-json {path}: {exc} (give the files earlier runs' --json wrote)")
        first = first or run
        differ = [k for k in ("model", "text_length", "steps", "warmup") if run.get(k) != first.get(k)]
        if differ:
            parser.error(f"--from-json {path}: its {', '.join(differ)} differ from {paths[0]}'s; merge runs of "
                         "one model and shape only")
        fresh: dict[str, list[dict]] = {}
        for row in run["rows"]:
            fresh.setdefault(row["preset"], []).append(row)
            rounds[row["preset"]] = str(run.get("rounds", 1))
        by_preset.update(fresh)
    counts = sorted(set(rounds.values()), key=int)
    text = counts[0] if len(counts) == 1 else " or ".join(counts) + " (per preset)"
    return [r for rows in by_preset.values() for r in rows], title(first["model"], first["text_length"], text,
                                                                   first["steps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--presets", default=None,
                        help="Comma-separated presets and combinations (default: every one a runtime runs).")
    parser.add_argument("--runtimes", default=",".join(RUNTIMES), help=f"Comma-separated, of {', '.join(RUNTIMES)}.")
    parser.add_argument("--delegate", default="xnnpack", choices=("xnnpack", "none"),
                        help="ExecuTorch's lowering (default: the device profiles' XNNPACK).")
    parser.add_argument("--bf16", default="rounded,fp32",
                        help="With XNNPACK, how bf16 methods' ExecuTorch programs compute, comma-separated: "
                             "rounded (eager's values), fp32 (unrounded; its own row). Default: both.")
    parser.add_argument("--rounds", type=int, default=1, help="Interleaved rounds per preset (default 1).")
    parser.add_argument("--markdown", action="store_true", help="Print the table as Markdown (docs/measurements.md's).")
    parser.add_argument("--from-json", default=None, nargs="+", metavar="FILE",
                        help="Print the table of earlier runs' --json files instead of measuring; a later "
                             "file's rows of a preset replace an earlier file's.")
    add_run_options(parser)
    args = parser.parse_args()
    if args.from_json:
        render(*merged_runs(parser, args.from_json), args.markdown)
        return
    runtimes = chosen(parser, args.runtimes, RUNTIMES, "runtime(s)")
    known = [*PRESETS, *COMBINATIONS]
    presets = chosen(parser, args.presets, known, "preset(s)") if args.presets else known
    planned = plan(presets, runtimes)
    skipped = sorted(set(presets) - set(planned))
    if skipped:
        print(f"no exported runtime runs: {', '.join(skipped)}", file=sys.stderr)
    delegate = None if args.delegate == "none" else args.delegate
    bf16_modes = chosen(parser, args.bf16, BF16_MODES, "bf16 mode(s)") if delegate else ["rounded"]
    run = {"model": args.model, "steps": args.steps, "warmup": args.warmup, "text_length": args.text_length,
           "rounds": args.rounds, "delegate": delegate, "bf16": bf16_modes}
    kept = earlier_rows(args.json_out, run)
    if kept:
        print(f"{args.json_out}: keeping its rows of {', '.join(sorted({r['preset'] for r in kept}))} "
              "(the same run's settings); measuring the rest", file=sys.stderr)
    todo = {name: runtimes for name, runtimes in planned.items() if name not in {r["preset"] for r in kept}}

    def save(rows: list[dict]) -> None:
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({**run, "rows": kept + rows}, indent=2) + "\n")

    rows = kept + measure(args.model, todo, delegate, bf16_modes, args.rounds, args.steps, args.warmup,
                          args.text_length, args.threads, save)
    render(rows, title(args.model, args.text_length, args.rounds, args.steps), args.markdown)


def earlier_rows(path: str | None, run: dict) -> list[dict]:
    """The rows an earlier run with the same settings left in `path` (a sweep goes on where it
    stopped); none if the file is absent or its settings differ."""
    if not path or not Path(path).exists():
        return []
    earlier = json.loads(Path(path).read_text())
    if any(earlier.get(k) != v for k, v in run.items()):
        return []
    failed = {r["preset"] for r in earlier["rows"] if r.get("step_s") is None}  # measured again
    return [r for r in earlier["rows"] if r["preset"] not in failed]


if __name__ == "__main__":
    main()
