"""`edgebench devices`'s rows as a function (edgebench.devices.listing.device_rows)."""

from __future__ import annotations

from edgebench.devices.listing import device_rows


def test_rows_without_contact_are_not_checked_and_a_bad_entry_is_a_row_saying_why(tmp_path, monkeypatch):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("devices:\n  here: {profile: local}\n  broken: {profile: no-such-profile, host: x}\n")
    monkeypatch.setenv("EDGEBENCH_INVENTORY", str(inventory))
    rows = {r["name"]: r for r in device_rows(contact=False)}
    assert (rows["here"]["profile"], rows["here"]["readiness"], rows["here"]["reachable"]) == \
        ("local", "not checked", "not checked")
    assert rows["broken"]["readiness"] == "bad entry" and "no-such-profile" in rows["broken"]["problems"][0]
    checked = {r["name"]: r for r in device_rows(contact=True)}
    assert checked["here"]["reachable"] == "ok"  # this host: reached at once
