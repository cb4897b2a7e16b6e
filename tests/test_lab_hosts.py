"""Two hosts sharing one lab device's login and work dir (issue 71): each host's `status` and
`collect` see its own sweep only and say how many they left out; `--all` sees both, the other
host's sweep marked as such. A sweep an older edgebench made (no host record) counts as each one's."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgebench.cli import cli
from edgebench.devices import lab
from edgebench.devices.inventory import NO_HOST_RECORD, host_identity, read_inventory, write_inventory
from edgebench.results.store import Store
from edgebench.runner.spec import RunSpec
from lab_fixtures import lab_in, wait_for_sweep

pytestmark = pytest.mark.lab


@contextlib.contextmanager
def as_host(inventory: Path) -> Iterator[None]:
    """Commands run as the host whose config folder holds `inventory` (its host-id beside it)."""
    saved = os.environ["EDGEBENCH_INVENTORY"]
    os.environ["EDGEBENCH_INVENTORY"] = str(inventory)
    try:
        yield
    finally:
        os.environ["EDGEBENCH_INVENTORY"] = saved


def run(*args: str) -> dict:
    out = CliRunner().invoke(cli, [*args, "--json"])
    assert out.exit_code == 0, out.output
    parsed: dict = json.loads(out.output)
    return parsed


def test_two_hosts_on_one_device_see_their_own_sweeps(tmp_path):
    spec = tmp_path / "spec.json"
    RunSpec(method="sgd", steps=1, warmup_steps=0).save(spec)
    with lab_in(tmp_path, [lab.LabDevice("raspberry-pi-4-4gb")]):
        (name, entry), = read_inventory().items()
        hosts = {"a": tmp_path / "inventory.yaml", "b": tmp_path / "b" / "inventory.yaml"}
        write_inventory({name: entry}, hosts["b"])
        sweeps, labels = {}, {}
        for host, inventory in hosts.items():
            with as_host(inventory):
                deployed = run("deploy", "--device", name, "--spec", str(spec), "--runs-dir", str(tmp_path / host))
                sweeps[host] = deployed[name]["sweep_id"]
                labels[host] = host_identity().label
                wait_for_sweep(name, sweeps[host])
        old = Path(entry["workdir"]) / "sweeps" / "20200101-000000-old"  # an older edgebench's: no host.json
        old.mkdir()
        (old / "sweep.json").write_text('{"state": "finished", "runs": {}}\n')
        for host, other in (("a", "b"), ("b", "a")):
            with as_host(hosts[host]):
                (row,) = run("status", "--device", name)
                assert set(row["sweeps"]) == {sweeps[host], old.name} and row["others"] == 1
                assert row["sweeps"][old.name]["owner"] == NO_HOST_RECORD
                (row,) = run("status", "--device", name, "--all")
                assert set(row["sweeps"]) == {sweeps["a"], sweeps["b"], old.name} and row["others"] == 0
                assert "owner" not in row["sweeps"][sweeps[host]]
                assert row["sweeps"][sweeps[other]]["owner"] == labels[other]
                runs_dir, store = tmp_path / host, tmp_path / host / "edgebench.duckdb"
                got = run("collect", "--device", name, "--runs-dir", str(runs_dir), "--store", str(store))[name]
                assert len(got["runs"]) == 1 and got["other_sweeps_left"] == 1 and got["other_hosts_runs"] == {}
                with Store(store, read_only=True) as db:
                    assert [r["run_id"] for r in db.runs(device=name)] == list(got["runs"])
                everything = run("collect", "--device", name, "--runs-dir", str(runs_dir), "--no-ingest", "--all")
                got_all = everything[name]
                assert len(got_all["runs"]) == 2 and got_all["other_sweeps_left"] == 0
                assert list(got_all["other_hosts_runs"].values()) == [labels[other]]
                assert set(got_all["runs"]) - set(got_all["other_hosts_runs"]) == set(got["runs"])
