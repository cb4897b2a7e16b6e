"""One descriptor per power source (edgebench/telemetry/power.py POWER_SOURCES): the sampler's
intervals, the profile's choices, the board probe and the readiness check all come from it; a
source the sampler cannot schedule is a failed source, not a crash; a sampler that cannot start
still ends the run with a result.json saying why."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from edgebench.devices import detect, readiness
from edgebench.devices.profiles import ProfileError, load_profile, parse_profile
from edgebench.runner.spec import RunSpec
from edgebench.runner.supervisor import run_spec
from edgebench.telemetry import power, sampler
from edgebench.telemetry.sampler import INTERVALS_S, Sampler
from edgebench.telemetry.sysfs import SourceUnavailable

NAMES = list(power.POWER_SOURCES)
PI5 = Path(__file__).parent / "fixtures" / "devices" / "raspberry-pi-5"


def no_command(argv):
    raise FileNotFoundError(errno.ENOENT, "no such command", argv[0])


@pytest.mark.parametrize("name", NAMES)
def test_every_term_of_a_power_source_exists(name, tmp_path):
    source = power.POWER_SOURCES[name]
    assert source.name == name
    for reader, interval in source.intervals_s.items():  # every reader make() can return
        assert INTERVALS_S[reader] == interval > 0
    assert name in source.intervals_s
    assert f"kv {name} " in source.probe and source.probe.endswith("\n")
    assert source.fix is None or source.fix in readiness.FIXES
    status, detail, needs_fix = source.ready([], {"rails": []})  # the probe found nothing
    assert status == "warn" and detail
    # a board without it: the reader says why, and auto-detection moves on
    with pytest.raises(SourceUnavailable):
        source.make(tmp_path, no_command, power.power_settings({"power": {"source": name}}))
    found, reasons = power.measured_power_source(tmp_path, no_command, {"power": {"source": name}})
    assert found is None and name in reasons


def test_a_profile_names_exactly_the_described_sources():
    from edgebench.devices.profiles import Power

    for name in ("none", "auto", *NAMES):
        assert Power(source=name).source == name
    with pytest.raises(ValueError, match="unknown power source 'ina219'; use none, auto or one of ina3221"):
        Power(source="ina219")
    data = {**load_profile("raspberry-pi-5-8gb").model_dump(mode="json"), "sensors": {"power": {"source": "ina219"}}}
    with pytest.raises(ProfileError, match="unknown power source 'ina219'"):
        parse_profile(data, "pi.yaml")


def test_the_board_probe_runs_every_sources_lines_and_files_them_by_source(tmp_path):
    hwmon = tmp_path / "sys/class/hwmon/hwmon0"
    hwmon.mkdir(parents=True)
    (hwmon / "name").write_text("ina3221\n")
    (hwmon / "in1_label").write_text("VDD_IN\n")
    (hwmon / "in1_input").write_text("5000\n")
    zone = tmp_path / "sys/class/powercap/intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "energy_uj").write_text("123\n")
    out = subprocess.run(["sh", "-c", detect.PROBE, "sh", str(tmp_path), str(tmp_path / "w")],
                         capture_output=True, text=True, check=True).stdout
    facts = detect.parse_probe(out)
    assert facts.power["ina3221"] == ["VDD_IN\t5000"] and facts.power["rapl"] == ["package-0\t123"]
    assert "battery" not in facts.power
    assert power.POWER_SOURCES["ina3221"].ready(facts.power["ina3221"], {"rails": ["VDD_IN"]})[:2] == \
        ("ok", "INA3221 rails VDD_IN")
    status, detail, needs_fix = power.POWER_SOURCES["ina3221"].ready(facts.power["ina3221"], {"rails": ["VDD_CPU"]})
    assert status == "warn" and "VDD_CPU not found" in detail and not needs_fix


def test_a_source_with_no_interval_is_reported_failed_and_sampling_goes_on(tmp_path, monkeypatch):
    monkeypatch.delitem(sampler.INTERVALS_S, "system_memory")
    summary = Sampler(tmp_path / "s.jsonl", 9, rate_hz=50, root=PI5, sensors={"power": {"source": "none"}},
                      runner=no_command).start().stop()
    assert "no sampling interval for source 'system_memory'" in summary["sources_failed"]["system_memory"]
    assert "system_memory" not in summary["sources_active"] and summary["samples"] >= 1


def test_a_sampler_that_cannot_start_ends_the_run_with_a_result_saying_why(tmp_path, monkeypatch):
    def broken(self):
        raise KeyError("a source with no interval")

    monkeypatch.setattr(Sampler, "_detect", broken)
    spec = RunSpec(model="tiny", method="sgd", steps=1, warmup_steps=0, batch_size=1, text_length=8,
                   run_id="no-sampler", threads=1)
    result = run_spec(spec, tmp_path)
    assert result == json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "error"
    assert result["detail"] == "sampling could not start: KeyError: 'a source with no interval'"
    monkeypatch.undo()
    bad_rate = run_spec(RunSpec.from_dict({**spec.to_dict(), "sample_hz": 1000.0}), tmp_path / "rate")
    assert bad_rate["status"] == "error" and "sampling rate 1000.0 Hz is out of range" in bad_rate["detail"]
