"""`devices add`'s work as a function (edgebench.devices.add.add_board): what it asks, what it
writes and what it refuses before a board is contacted. The SSH host key and the probe are
stand-ins here (a fixture board's files read locally); tests/test_devices_add.py runs the
command against real lab sshds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from edgebench.devices import add, detect
from edgebench.devices.inventory import make_device, read_inventory
from edgebench.devices.transport import LocalTransport

PI5 = Path(__file__).parent / "fixtures" / "devices" / "raspberry-pi-5"
OPTIONS: dict[str, Any] = {"serial": None, "user": None, "port": None, "key": None, "fingerprint": None,
                           "known_hosts": None, "python": None, "workdir": None, "root": None}


def never(*args: Any) -> Any:
    raise AssertionError(f"asked {args}")


@pytest.fixture
def pi5(tmp_path, monkeypatch):
    """An empty inventory, and a board whose probe reads the Raspberry Pi 5 fixture's files."""
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(tmp_path / "inventory.yaml"))
    device = make_device("t", {"profile": "local", "kind": "local", "root": str(PI5), "workdir": str(tmp_path)})
    monkeypatch.setattr(add, "_check_host_key", lambda *args: None)
    monkeypatch.setattr(add, "_probe", lambda *args: detect.probe(LocalTransport(device), device))


def test_the_profile_is_asked_with_detections_proposal_first_and_the_entry_written(pi5):
    asked: list[tuple[list[str], str]] = []
    said: list[str] = []
    added = add.add_board("pi", host="pi.local", profile=None, yes=False, say=said.append, trust_key=never,
                          choose=lambda candidates, default: asked.append((candidates, default)) or default,
                          **OPTIONS)
    assert asked[0][1] == "raspberry-pi-5-8gb" and asked[0][0][0] == "raspberry-pi-5-8gb"
    assert added.entry == {"host": "pi.local", "profile": "raspberry-pi-5-8gb"}  # ssh: the profile's own kind
    assert read_inventory()["pi"]["profile"] == "raspberry-pi-5-8gb"
    assert said[0].startswith("found: Raspberry Pi 5 Model B") and said[-1].startswith("added pi (raspberry-pi-5-8gb)")


@pytest.mark.parametrize("name,options,words", [
    ("pi", {"host": "pi.local", "serial": "abc"}, "--host HOST (SSH) or --serial SERIAL"),
    ("../pi", {"host": "pi.local"}, "pick another name"),
    ("pi", {"host": "pi.local", "profile": "no-such-board"}, "unknown profile 'no-such-board'"),
])
def test_refused_before_the_board_is_contacted_with_nothing_written(pi5, monkeypatch, name, options, words):
    monkeypatch.setattr(add, "_probe", never)
    with pytest.raises(add.AddError, match=words.replace("(", r"\(").replace(")", r"\)")):
        add.add_board(name, **{**OPTIONS, "profile": None, **options}, yes=True, say=never, trust_key=never,
                      choose=never)
    assert read_inventory() == {}
