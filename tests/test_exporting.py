"""`edgebench export`'s work as functions (exporters.exporting): the request --delegate and --bf16
make from the profile's, and the stages the bar counts."""

from __future__ import annotations

import pytest

from edgebench.devices.profiles import load_profile
from exporters.exporting import export_request, export_stages

FIELDS = {"model": "tiny", "method": "sgd", "backend": "executorch", "batch_size": 1, "text_length": 32,
          "image_size": None, "seed": 0}


def test_the_profiles_choices_stand_unless_an_option_names_another():
    profile = load_profile("raspberry-pi-5-8gb")
    own = export_request(profile, "profile", "profile", **FIELDS)
    assert (own.delegate, own.bf16) == ("xnnpack" if profile.export.xnnpack else None, profile.export.bf16)
    plain = export_request(profile, "none", "profile", **FIELDS)
    assert (plain.delegate, plain.bf16) == (None, "rounded")  # no XNNPACK: bf16 rounded as eager rounds
    assert export_request(profile, "xnnpack", "fp32", **FIELDS).bf16 == "fp32"
    with pytest.raises(ValueError, match="choice of the XNNPACK lowering"):  # the command's usage error
        export_request(profile, "none", "fp32", **FIELDS)


def test_the_stages_follow_the_backend_the_method_and_profile():
    first = export_stages("executorch", False, 0)
    assert first[0] == "build model" and first[-1] == "write manifest" and "joint graph" in first
    assert "joint graph" not in export_stages("executorch", True, 0)  # MeZO: a forward-only program
    assert export_stages("executorch", False, 3) == [*first, "profile executorch", "profile eager"]
    assert "joint graph" not in export_stages("onnxruntime", False, 0)
