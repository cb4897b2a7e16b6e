"""`edgebench deploy`: the specs checked on this host (the run options, --program, --save, or
--spec files), a detached sweep started on each device (fleet/stopping.py, fleet/deploy.py), and
each device's sweep and run ids printed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgebench.fleet.checks import check_program, check_program_fits, check_save
from edgebench.fleet.commands.output import echo, echo_err
from edgebench.fleet.commands.targets import device_names
from edgebench.fleet.options import RERUN_OPTION, SAVE_OPTION, run_options
from edgebench.fleet.plan import make_specs
from edgebench.fleet.progress import plain_progress
from edgebench.fleet.spec_file import checked_spec
from edgebench.results import runs_dir_for, store_for
from edgebench.runner.spec import WEIGHTS_DIR, RunSpec

if TYPE_CHECKING:
    from edgebench.fleet.deploy import Deployment


@click.command()
@click.option("--device", "devices", multiple=True, required=True,
              help="Inventory name (repeatable; several devices run at once). See `edgebench devices`.")
@run_options
@click.option("--program", default=None, type=click.Path(exists=True, file_okay=False),
              help="A program exported beforehand (`edgebench export`); default: export for each device's "
                   "profile now (cached).")
@click.option("--spec", "spec_files", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="RunSpec JSON file to run as is (repeatable); replaces --methods and the shape options.")
@RERUN_OPTION
@SAVE_OPTION
def deploy(devices: tuple[str, ...], shape: dict[str, Any], methods: list[str], runs_dir: str | None, as_json: bool,
           program: str | None, spec_files: tuple[str, ...], rerun_disturbed: int, save: str | None,
           force: bool) -> None:
    """Start a sweep of methods on one or more devices, detached; print the run ids.

    Takes the same run options as `bench`. Preflight checks the device (Python,
    torch/executorch versions, free RAM and disk, arch vs backend); exported backends get
    their program exported for each device's profile (or --program); then edgebench's own
    source (no dependencies are installed on the device), the programs and one spec per
    method are shipped and the sweep starts with setsid/nohup, so it survives a dropped
    connection. Programs, a --model checkpoint folder, a --data dataset folder, a --tokenizer
    file and the native worker are shipped once and cached on the device; before every sweep
    the device checks each file's sha256, and a copy that changed there is sent again. One sweep runs on a device at a
    time: while one is running there, deploy is refused. With --save DIR each run keeps
    its trained weights, which `collect` brings back into DIR/<run_id>/. Clock probes are recorded
    for alignment. Fetch results with
    `edgebench collect`; watch with `edgebench status`. A board farm's device (a labgrid
    place) is acquired for the sweep: refused while someone holds it, given back if the
    deploy fails or is interrupted, else by `collect` once the sweep has ended.
    """
    from edgebench.fleet.stopping import deploy_or_stop

    device_names(devices, with_local=True)  # an unknown or unsafe name is refused before any work
    specs = _deploy_specs(spec_files, program, shape, methods, save)
    try:
        # Each stage is a line on stderr; off a terminal each carries the elapsed time too.
        results = deploy_or_stop(list(devices), specs, runs_dir_for(runs_dir), store_for(None, runs_dir),
                                 log=(lambda _: None) if as_json else plain_progress(sys.stderr) or echo_err,
                                 said=echo_err, save_to=str(Path(save).resolve()) if save else None, force=force,
                                 rerun_disturbed=rerun_disturbed)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    _show_deploy(results, as_json)
    failed = {name: str(r) for name, r in results.items() if isinstance(r, Exception)}
    if failed:
        started = [r for r in results.values() if not isinstance(r, Exception)]
        echo_err(f"deploy: {len(started)} of {len(results)} device(s) started a sweep "
                 f"({sum(len(r.run_ids) for r in started)} runs); {', '.join(failed)} failed")
        raise SystemExit(1)


def _deploy_specs(spec_files: tuple[str, ...], program: str | None, shape: dict[str, Any], methods: list[str],
                  save: str | None) -> list[RunSpec]:
    """The specs deploy ships: the --spec files checked, else one per method; with --save each
    keeps its weights in its run directory (collect brings them back)."""
    if spec_files:
        specs = [checked_spec(path) for path in spec_files]
    else:
        check_program(program, shape["backend"])
        specs = make_specs(methods, program=program, **shape)
    for spec in specs:
        check_program_fits(spec)
        check_save(save, spec.backend)
        spec.save_dir = WEIGHTS_DIR if save else spec.save_dir
    return specs


def _show_deploy(results: dict[str, Deployment | Exception], as_json: bool) -> None:
    """Each device's sweep and run ids (or why it failed), as lines or JSON."""
    if as_json:
        click.echo(json.dumps({name: {"error": str(r)} if isinstance(r, Exception) else
                               {"sweep_id": r.sweep_id, "sweep_dir": r.sweep_dir, "run_ids": r.run_ids,
                                "refused": r.refused}
                               for name, r in results.items()}, indent=2))
        return
    for name, r in results.items():
        if isinstance(r, Exception):
            echo(f"{name}: FAILED: {r}", fg="red", err=True)
            continue
        click.echo(f"{name}: sweep {r.sweep_id}")
        for run_id in r.run_ids:
            click.echo(f"  {run_id}")
        for method, why in r.refused.items():
            echo(f"  {method}: unsupported: {why}", fg="yellow")
