"""What a run may take on a device (edgebench.methods.budget): one figure for predict, the
preflights, the lab and the reports; a lab device that is the board it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgebench.devices import lab
from edgebench.devices.profiles import REPO_PROFILES_DIR, ProfileError, list_profiles, load_profile, parse_profile
from edgebench.fleet.plan import device_budget
from edgebench.methods.budget import SUPERVISOR_BYTES, available_bytes, board_budget, reported_budget
from lab_fixtures import lab_in

MIB, GIB = 2**20, 2**30


def test_the_budget_is_ram_less_the_os_the_supervisor_and_the_margin():
    held_to = board_budget("board", GIB, 200 * MIB, "a source", "python", 0.03)
    assert held_to.bytes == GIB - 200 * MIB - SUPERVISOR_BYTES["python"] - int(GIB * 0.03)
    assert board_budget("board", GIB, 200 * MIB, "a source", "shell", 0.03).bytes == \
        held_to.bytes + SUPERVISOR_BYTES["python"] - SUPERVISOR_BYTES["shell"]
    assert board_budget("board", 100 * MIB, 200 * MIB, "a source").bytes == 0  # never negative
    record = held_to.record()
    assert record["budget_bytes"] == held_to.bytes and record["os_source"] == "a source"
    with pytest.raises(ValueError, match="supervisor 'perl'"):
        board_budget("board", GIB, 0, "x", "perl")


def test_a_reported_budget_takes_what_the_device_could_give_a_new_process():
    held_to = reported_budget("dev", GIB, 800 * MIB)
    assert held_to.os_bytes == 224 * MIB and "800 MiB available" in held_to.os_source
    more = reported_budget("dev", GIB, 4 * GIB)  # a device reporting more than the RAM it stands for
    assert more.os_bytes == 0 and "the RAM bounds it" in more.os_source


def test_a_cgroup_full_of_page_cache_is_free_and_its_tmpfs_is_not():
    facts = {"mem_available_bytes": 20 * GIB, "cgroup_limit_bytes": GIB, "cgroup_usage_bytes": 700 * MIB,
             "cgroup_cache_bytes": 450 * MIB}
    assert available_bytes(facts) == GIB - 250 * MIB
    profile = load_profile("raspberry-pi-4-4gb").model_copy(update={"ram_bytes": GIB})
    held_to = device_budget(profile, "lab-pi4", "python", facts)
    assert held_to.ram_bytes == GIB and held_to.os_bytes == 250 * MIB


def test_every_shipped_profile_gives_its_os_figure_with_its_source_or_says_it_estimates():
    for pid in list_profiles():
        profile = load_profile(pid)
        held, source = profile.os_idle()
        assert 0 < held < int(profile.ram_bytes), pid
        if profile.os_memory is not None:
            assert "#" in profile.os_memory.source, (pid, "name the public measurement")
        else:
            assert source.startswith("estimate:"), (pid, source)


def test_a_1_gib_raspberry_pi_leaves_a_python_run_751_mib():
    held_to = load_profile("raspberry-pi-4-4gb").budget("pi", GIB)
    assert held_to.os_bytes // MIB == 202 and held_to.bytes // MIB == 751, held_to.text()


def test_a_profile_whose_os_figure_is_not_a_size_or_not_below_its_ram_is_refused():
    data = yaml.safe_load((REPO_PROFILES_DIR / "raspberry-pi-zero-2w.yaml").read_text())
    with pytest.raises(ProfileError, match=r"os_memory.fixed: .*write bytes or a size like 8GiB"):
        parse_profile({**data, "os_memory": {"fixed": "a lot", "source": "somebody's blog #1"}})
    with pytest.raises(ProfileError, match="os_memory: .* is not less than ram_bytes"):
        parse_profile({**data, "os_memory": {"fixed": "600MiB", "source": "somebody's blog #1"}})


def test_lab_up_refuses_a_memory_that_leaves_a_run_no_room(edgebench_here, tmp_path):
    done = edgebench_here("lab", "up", "--profile", "raspberry-pi-zero-2w", "--memory", "200MiB", cwd=tmp_path,
                          env={"EDGEBENCH_LAB_DIR": str(tmp_path / "lab"),
                               "EDGEBENCH_INVENTORY": str(tmp_path / "inventory.yaml")})
    assert done.returncode == 2, done.stderr
    assert "--memory 200 MiB: leaves a run no room on a raspberry-pi-zero-2w board" in done.stderr
    assert "give --memory of at least" in done.stderr and not (tmp_path / "inventory.yaml").exists()


@pytest.mark.lab
def test_a_lab_device_is_the_board_it_names(tmp_path, edgebench_here):
    with lab_in(tmp_path, [lab.LabDevice("raspberry-pi-4-4gb", name="lab-1gib", memory_bytes=GIB, cpus=1)]):
        (status,) = lab.status()
        os_bytes = status["os_memory_bytes"]
        assert os_bytes // MIB == 202
        assert status["usage_bytes"] >= os_bytes  # held inside its cgroup, charged to it
        devices = edgebench_here("devices", "--json", cwd=tmp_path)
        row = next(d for d in json.loads(devices.stdout)["devices"] if d["name"] == "lab-1gib")
        assert row["ram_bytes"] == GIB and row["cores"] == 1, row
        predicted = edgebench_here("predict", "--device", "lab-1gib", "--model", "nanovlm-222m", "--json",
                                   cwd=tmp_path)
        verdict = json.loads(predicted.stdout)
        assert verdict["usable_bytes_est"] // MIB == 751 and "lab-1gib" in verdict["budget_text"]
        assert "qlora4" in verdict["fits_est"] and "sgd" not in verdict["fits_est"]
        held = Path(lab.read_state()["lab-1gib"]["os_memory_file"])
        assert held.stat().st_size == os_bytes
    assert not held.exists()  # `lab down` gives the board's OS memory back


def test_a_run_s_figures_hold_its_peak_against_the_budget_it_was_held_to():
    from edgebench.figures.run import budget_figures

    spec = {"extra": {"budget": board_budget("lab-pi4", GIB, 202 * MIB, "x").record()}}
    figures = budget_figures(spec, 553 * MIB)
    assert figures["budget_bytes"] == spec["extra"]["budget"]["budget_bytes"]
    assert figures["peak_of_budget"] == round(553 * MIB / figures["budget_bytes"], 3)
    assert budget_figures({}, 553 * MIB) == {"budget_bytes": None, "peak_of_budget": None}  # an older run
    assert budget_figures({"extra": {"budget": {"budget_bytes": "lots"}}}, 1)["budget_bytes"] is None
