"""The study's first table: every method fine-tuning nanovlm-222m at batch 1 on this host.

For each preset (and a few combinations) one fresh runner process (`python -m edgebench.runner`)
measures the kernel peak RSS (ru_maxrss), the median step time and the loss; the memory model's
prediction (an estimate) stands beside it. Methods that store frozen weights in bf16/int8 build
the model in bf16 (the eager backend does), so loading never holds fp32 weights.

    .venv/bin/python bench/methods.py [--model nanovlm-222m] [--steps 3] [--methods a,b,...]
    .venv/bin/python bench/methods.py --backend onnxruntime [--methods sgd,lora,...]
    .venv/bin/python bench/methods.py --model nanovlm-460m --price [--rounds 2]

`--price`: the price of memory in step time. Each 1 GiB configuration (edgebench.methods.fit) and
the preset it builds on, without the memory levers (fit.UNCONSTRAINED), run alternately for
`--rounds` rounds so both see the same host load; run it on a quiet host.

`--backend executorch|onnxruntime`: each method the runtime runs is exported (cached per
request) and run beside the same method on eager, interleaved (exported, then eager, per
method), so both see the same host load; the table shows peak RSS and median step time of
both and their ratio. Methods the runtime cannot express are listed with the reason.

Heavy: full AdamW on 222M takes 2-5 s a step and ~4 GB; run it when the host is quiet.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgebench.backends.support import unsupported_reason
from edgebench.fleet.local import run_local
from edgebench.methods import PRESETS, memory, parse_method
from edgebench.methods.fit import COMBINATIONS, UNCONSTRAINED
from edgebench.runner.spec import RunSpec

GiB = 1 << 30


def run_one(model: str, name: str, steps: int, out: Path, backend: str = "eager", timeout_s: float = 600) -> dict:
    method = parse_method(name)
    batch = method.accumulation  # accumN splits the batch: its smallest batch is N
    run_id = name.replace("+", "_") + ("" if backend == "eager" else f"-{backend}")
    spec = RunSpec(model=model, method=name, backend=backend, batch_size=batch, text_length=32,
                   warmup_steps=1, steps=steps, threads=2, timeout_s=timeout_s, run_id=run_id)
    export_s = None
    if backend != "eager":
        import time

        from exporters.pipeline import export_for_spec

        started = time.perf_counter()
        spec.program = export_for_spec(spec, on_stage=lambda stage: print(f"  [{name}] {stage}", flush=True))
        export_s = round(time.perf_counter() - started, 1)
    result = run_local(spec, out / "runs" / spec.run_id)
    predicted = memory.predict(model, method, batch, 32)
    return {"method": name, "batch_size": batch, "status": result.get("status"),
            "peak_rss_bytes_kernel": result.get("peak_rss_bytes_kernel"),
            "predicted_peak_bytes_est": predicted["peak_bytes"],
            "step_time_s_median": (result.get("step_time_s") or {}).get("median"),
            "loss_first": result.get("loss_first"), "loss_last": result.get("loss_last"),
            "backend": backend, "export_s": export_s, "detail": result.get("detail", "")}


def run_beside_eager(model: str, name: str, steps: int, out: Path, backend: str) -> dict:
    """The method on `backend` and on eager, one after the other, with the ratios."""
    reason = unsupported_reason(parse_method(name), backend)
    if reason:
        return {"method": name, "backend": backend, "status": "unsupported", "detail": reason}
    row = run_one(model, name, steps, out, backend)
    eager = run_one(model, name, steps, out)
    row["eager"] = {k: eager[k] for k in ("status", "peak_rss_bytes_kernel", "step_time_s_median",
                                           "loss_first", "loss_last")}
    for key in ("peak_rss_bytes_kernel", "step_time_s_median"):
        mine, base = row[key], eager[key]
        row[f"{key}_vs_eager"] = round(mine / base, 3) if mine and base else None
    return row


def render_beside(rows: list[dict], model: str, backend: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model}, batch 1, this host: {backend} beside eager (one run each, interleaved)")
    for col in ("method", "status", "peak RSS MiB", "eager MiB", "x eager", "step s", "eager s", "x eager",
                "loss first -> last", "eager loss", "export s"):
        table.add_column(col, justify="left" if col in ("method", "status") else "right")

    def mib(v):
        return "-" if not v else f"{v / 2**20:,.0f}"

    def num(v, digits=2):
        return "-" if v is None else f"{v:.{digits}f}"

    def loss(r):
        return "-" if r.get("loss_first") is None else f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"

    for r in rows:
        if r["status"] == "unsupported":
            table.add_row(r["method"], "unsupported", *["-"] * 9)
            continue
        e = r["eager"]
        table.add_row(
            r["method"],
            r["status"] if r["status"] == e["status"] else f"{r['status']} / eager {e['status']}",
            mib(r["peak_rss_bytes_kernel"]),
            mib(e["peak_rss_bytes_kernel"]),
            num(r["peak_rss_bytes_kernel_vs_eager"]),
            num(r["step_time_s_median"], 3),
            num(e["step_time_s_median"], 3),
            num(r["step_time_s_median_vs_eager"]),
            loss(r),
            loss(e),
            num(r["export_s"], 1),
        )
    Console().print(table)
    for r in rows:
        if r["status"] == "unsupported":
            print(f"  {r['method']}: {r['detail']}")


def run_priced(model: str, names: list[str], steps: int, rounds: int, out: Path, timeout_s: float) -> list[dict]:
    """Each configuration beside its unconstrained preset, alternately, `rounds` times over."""
    rows = []
    for round_ in range(rounds):
        for name in names:
            row = {"method": name, "round": round_}
            for key, which in (("constrained", name), ("unconstrained", UNCONSTRAINED[name])):
                print(f"round {round_ + 1}/{rounds}: {which} ({steps} steps after one warmup) ...",
                      file=sys.stderr, flush=True)
                row[key] = run_one(model, which, steps, out / f"round{round_}", timeout_s=timeout_s)
            mine, base = row["constrained"]["step_time_s_median"], row["unconstrained"]["step_time_s_median"]
            row["step_time_vs_unconstrained"] = round(mine / base, 3) if mine and base else None
            rows.append(row)
            (out / "price.json").write_text(json.dumps(rows, indent=2))
            print(json.dumps(row), flush=True)
    return rows


def render_priced(rows: list[dict], model: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model}, batch 1, this host: each configuration beside its unconstrained preset "
                        "(interleaved)")
    # short headings: at 80 columns the configuration's 80-odd characters need the room
    for col in ("configuration", "round", "MiB", "s/step", "preset", "MiB ", "s/step ", "x"):
        table.add_column(col, justify="left" if col in ("configuration", "preset") else "right",
                         overflow="fold")

    def cells(r: dict) -> list[str]:
        peak, step = r["peak_rss_bytes_kernel"], r["step_time_s_median"]
        return ["-" if not peak else f"{peak / 2**20:,.0f}", "-" if step is None else f"{step:.2f}"]

    for r in rows:
        ratio = r["step_time_vs_unconstrained"]
        table.add_row(r["method"], str(r["round"]), *cells(r["constrained"]), r["unconstrained"]["method"],
                      *cells(r["unconstrained"]), "-" if ratio is None else f"{ratio:.2f}")
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    print("MiB: the worker's kernel peak; s/step: median step; x: the configuration's step time over "
          "its preset's")


def render(rows: list[dict], model: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{model}, batch 1, this host (predicted = estimate)")
    for col in ("method", "status", "peak RSS MiB", "predicted MiB (est.)", "pred. error",
                "median step s", "loss first -> last"):
        table.add_column(col)
    for r in rows:
        peak, pred = r["peak_rss_bytes_kernel"], r["predicted_peak_bytes_est"]
        error = f"{(pred - peak) / peak:+.0%}" if peak else "-"
        loss = "-" if r["loss_first"] is None else f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"
        step = "-" if r["step_time_s_median"] is None else f"{r['step_time_s_median']:.2f}"
        name = r["method"] + (f" (batch {r['batch_size']})" if r["batch_size"] != 1 else "")
        table.add_row(name, r["status"], "-" if not peak else f"{peak / 2**20:,.0f}",
                      f"{pred / 2**20:,.0f}", error, step, loss)
    Console(width=None if sys.stdout.isatty() else 140).print(table)
    # Runs stopped early (timeout, interrupt) count too: their peak is the kernel's up to the stop.
    errors = [
        (abs(r["predicted_peak_bytes_est"] - r["peak_rss_bytes_kernel"]) / r["peak_rss_bytes_kernel"], r["method"])
        for r in rows
        if r["peak_rss_bytes_kernel"] and r["status"] != "unsupported"
    ]
    if errors:
        worst, name = max(errors)
        over = [n for e, n in sorted(errors, reverse=True) if e > 0.10]
        print(f"memory model (estimate) vs kernel peak: max |error| {worst:.1%} ({name}) over {len(errors)} "
              f"methods; over 10%: {', '.join(over) or 'none'}")
    fits = [r["method"] for r in rows if r["peak_rss_bytes_kernel"] and r["peak_rss_bytes_kernel"] <= GiB
            and r["loss_last"] is not None and r["loss_last"] < r["loss_first"]]
    print(f"fine-tune within 1 GiB peak RSS while the loss falls: {', '.join(fits) or 'none'}")


def repredicted(paths: list[str], model: str) -> list[dict]:
    """Rows of earlier eager runs on `model` with the memory model's prediction made again (the
    measurement does not depend on the model); the last run of a method wins."""
    rows: dict[str, dict] = {}
    for path in map(Path, paths):
        if path.is_dir():
            r = json.loads((path / "result.json").read_text())
            if r.get("model") != model or r.get("backend") != "eager":
                continue
            found = [{"method": r["method"], "batch_size": r["batch_size"], "status": r.get("status"),
                      "peak_rss_bytes_kernel": r.get("peak_rss_bytes_kernel"),
                      "step_time_s_median": (r.get("step_time_s") or {}).get("median"),
                      "loss_first": r.get("loss_first"), "loss_last": r.get("loss_last")}]
        else:
            found = json.loads(path.read_text())
        for row in found:
            rows[row["method"]] = row
    for row in rows.values():
        method = parse_method(row["method"])
        row["predicted_peak_bytes_est"] = memory.predict(model, method, row["batch_size"], 32)["peak_bytes"]
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="nanovlm-222m")
    parser.add_argument("--steps", type=int, default=3, help="measured steps after one warmup step")
    parser.add_argument("--methods", default=None,
                        help="comma-separated (default: every preset and combination; with --backend, "
                             "every preset, the ones the runtime cannot run listed with the reason)")
    parser.add_argument("--backend", default="eager", choices=("eager", "executorch", "onnxruntime"),
                        help="an exported runtime to run beside eager")
    parser.add_argument("--out", default="runs/bench-methods")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a run may take (eager runs)")
    parser.add_argument("--repredict", nargs="+", metavar="PATH",
                        help="no runs: earlier eager measurements (a methods.json, or run directories "
                             "holding result.json) beside this version's memory model")
    parser.add_argument("--price", action="store_true",
                        help="each 1 GiB configuration (or --methods among them) beside its unconstrained preset")
    parser.add_argument("--rounds", type=int, default=2, help="with --price: rounds of the interleaving")
    args = parser.parse_args()
    if args.price:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        names = args.methods.split(",") if args.methods else list(UNCONSTRAINED)
        unknown = [n for n in names if n not in UNCONSTRAINED]
        if unknown:
            parser.error(f"--price takes the 1 GiB configurations ({', '.join(UNCONSTRAINED)}), "
                         f"not {', '.join(unknown)}")
        render_priced(run_priced(args.model, names, args.steps, args.rounds, out, args.timeout), args.model)
        return
    if args.repredict:
        render(repredicted(args.repredict, args.model), args.model)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    default = list(PRESETS) if args.backend != "eager" else [*PRESETS, *COMBINATIONS]
    names = args.methods.split(",") if args.methods else default
    rows = []
    for name in names:
        rows.append(run_one(args.model, name, args.steps, out, timeout_s=args.timeout) if args.backend == "eager" else
                    run_beside_eager(args.model, name, args.steps, out, args.backend))
        (out / ("methods.json" if args.backend == "eager" else f"methods-{args.backend}.json")).write_text(
            json.dumps(rows, indent=2)
        )
        print(json.dumps(rows[-1]), flush=True)
    if args.backend == "eager":
        render(rows, args.model)
    else:
        render_beside(rows, args.model, args.backend)


if __name__ == "__main__":
    main()
