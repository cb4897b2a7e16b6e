"""deploy's Ctrl-C as a function (edgebench.fleet.deploy.deploy_or_stop): only the sweeps this
deploy started are stopped, collected and ingested, and the interrupt goes on. No device is
reached: the deploy, the stop and the collect are stand-ins."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from edgebench.fleet import collect, deploy, status


def test_a_ctrl_c_stops_the_sweeps_this_deploy_started_and_no_earlier_one(tmp_path, monkeypatch):
    records = tmp_path / "pi" / "deployments.jsonl"
    records.parent.mkdir()
    records.write_text(json.dumps({"sweep_id": "old", "sweep_dir": "/w/old"}) + "\n")  # an earlier deploy's

    def deploy_many(names, specs, local_root, log, save_to, force):
        with open(records, "a") as fh:
            fh.write(json.dumps({"sweep_id": "new", "sweep_dir": "/w/new"}) + "\n")
        raise KeyboardInterrupt  # while another device is still being deployed to

    stopped: list[str] = []
    monkeypatch.setattr(deploy, "deploy_many", deploy_many)
    monkeypatch.setattr(status, "stop_sweep", lambda name, sweep_dir: stopped.append(sweep_dir) or {"state": "stopped"})
    monkeypatch.setattr(collect, "collect_device", lambda *args: SimpleNamespace(ingested=["r1", "r2"]))
    said: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        deploy.deploy_or_stop(["pi"], [], tmp_path, tmp_path / "store.duckdb", log=print, said=said.append,
                              save_to=None, force=False)
    assert stopped == ["/w/new"]
    assert said == ["pi: interrupted: sweep new stopped (stopped); 2 runs collected and ingested"]
