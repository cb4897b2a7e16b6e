"""This host's identity (issue 71): made once per host user beside the inventory; each sweep
records it, so status and collect take this host's sweeps on a device several hosts use."""

from __future__ import annotations

import pytest

from edgebench.devices.inventory import NO_HOST_RECORD, InventoryError, host_identity


def test_the_id_is_made_once_per_config_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "a" / "inventory.yaml"))
    first = host_identity()
    assert (tmp_path / "a" / "host-id").read_text().strip() == first.id and "@" in first.label
    assert host_identity() == first
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["host-id"]  # no temporary file left
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "b" / "inventory.yaml"))
    assert host_identity().id != first.id


def test_a_bad_id_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    (tmp_path / "host-id").write_text("../elsewhere\n")
    with pytest.raises(InventoryError, match="host-id.*delete the file"):
        host_identity()


def test_whose_sweep(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    me = host_identity()
    assert me.whose(me.record()) is None
    assert me.whose({"id": "other", "label": "bob@box\x1b[2J"}) == "bob@box"  # printable: a device said it
    assert me.whose({"id": "other"}) == "other"
    assert me.whose(None) == me.whose({"label": me.label}) == NO_HOST_RECORD
