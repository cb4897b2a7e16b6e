"""A deploy that Ctrl-C interrupts leaves nothing behind: the sweeps it had already started are
stopped (their running run ends `interrupted`), collected and ingested. Apart from deploy.py,
which collect.py reads (deployments), so neither imports the other."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from edgebench.fleet.collect import collect_device
from edgebench.fleet.deploy import Deployment, deploy_many, deployments
from edgebench.fleet.local import shielded
from edgebench.fleet.status import stop_sweep
from edgebench.runner.spec import RunSpec


def deploy_or_stop(names: list[str], specs: list[RunSpec], local_root: Path, store_path: Path, *,
                   log: Callable[[str], None], said: Callable[[str], None], save_to: str | None,
                   force: bool, rerun_disturbed: int = 0) -> dict[str, Deployment | Exception]:
    """deploy_many; on a Ctrl-C the sweeps it had already started are stopped (their running run
    ends `interrupted`), collected and ingested into the store, shielded from another Ctrl-C, so
    nothing started is left behind (`said` tells each), and then the KeyboardInterrupt goes on."""
    known = {name: len(deployments(name, local_root)) for name in names}
    try:
        return deploy_many(names, specs, local_root, log=log, save_to=save_to, force=force,
                           rerun_disturbed=rerun_disturbed)
    except KeyboardInterrupt:
        with shielded(True):
            _stop_started(known, local_root, store_path, said)
        raise


def _stop_started(known: dict[str, int], local_root: Path, store_path: Path, said: Callable[[str], None]) -> None:
    """Stops, collects and ingests each sweep recorded since `known` counted them."""
    for name, count in known.items():
        for record in deployments(name, local_root)[count:]:
            try:
                state = stop_sweep(name, record["sweep_dir"])
                got = collect_device(name, None, local_root, store_path)
                said(f"{name}: interrupted: sweep {record['sweep_id']} stopped ({state.get('state')}); "
                     f"{len(got.ingested)} runs collected and ingested")
            except (RuntimeError, ValueError, OSError) as exc:
                said(f"{name}: interrupted: sweep {record['sweep_id']} could not be stopped ({exc}); "
                     f"`edgebench status --device {name}` shows it")
