"""The one registry of replacements of upstream internals (exporters/upstream.py): every entry
is live and matches the pinned releases; a replacement whose target changed upstream is not
applied, the export takes upstream's own path and still writes the same program; nothing is
created that upstream lacks; nothing is replaced without an entry."""

from __future__ import annotations

import types

import pytest
import torch

from exporters import upstream
from test_export_executorch import Attention


@pytest.mark.parametrize("target", sorted(upstream.REPLACEMENTS))
def test_every_entry_is_live_and_matches_the_pinned_releases(target):
    entry = upstream.REPLACEMENTS[target]
    assert upstream.fingerprint(upstream.resolve(target)) == entry.fingerprint, \
        f"{target} changed upstream: read it again and update its fingerprint in exporters/upstream.py"
    assert entry.why


def test_a_changed_target_leaves_its_group_unapplied_and_the_program_the_same(monkeypatch, capsys):
    import exporters.executorch as et

    torch.manual_seed(0)
    inputs = (torch.randn(2, 8, 16), torch.randint(0, 10, (16,)))
    model = Attention(autocast=False)
    patched = et.lower_training_step(model, inputs).buffer
    for target, entry in list(upstream.REPLACEMENTS.items()):  # upstream changed everything
        monkeypatch.setitem(upstream.REPLACEMENTS, target, upstream.Replacement(target, "0" * 16, entry.why))
    monkeypatch.setattr(upstream, "_SAID", set())
    capsys.readouterr()
    assert et.lower_training_step(model, inputs).buffer == patched  # upstream's own path, the same program
    said = capsys.readouterr().err
    assert "not replacing executorch.exir.program._program:serialize_for_executorch" in said
    assert "changed upstream (fingerprint" in said and "upstream's own path runs" in said


def test_nothing_is_created_that_upstream_lacks_nor_replaced_without_an_entry(monkeypatch):
    owner = types.ModuleType("fake_upstream")
    owner.there = lambda: "upstream's"
    for name in ("there", "gone"):
        target = upstream.target_of(owner, name)
        monkeypatch.setitem(upstream.REPLACEMENTS, target,
                            upstream.Replacement(target, upstream.fingerprint(owner.there), "a test"))
    with upstream.replaced(owner, there=lambda: "ours"):
        assert owner.there() == "ours"
    assert owner.there() == "upstream's"
    with upstream.replaced(owner, there=lambda: "ours", gone=lambda: "ours"):  # one is gone: none applied
        assert owner.there() == "upstream's" and not hasattr(owner, "gone")
    with pytest.raises(KeyError, match="fake_upstream:other: replaced without an entry"):
        with upstream.replaced(owner, other=1):
            pass
