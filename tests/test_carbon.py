"""The CO2 beside energy (issue 69): grams of CO2e = kWh x the grid's carbon intensity, as
codecarbon computes its emissions; the intensity the user's (--carbon-intensity, else
$EDGEBENCH_CARBON_INTENSITY) or codecarbon's world average, and always labelled an estimate."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from click.testing import CliRunner

from edgebench.figures.carbon import (
    CO2_OF,
    DEFAULT_G_PER_KWH,
    ENV,
    CarbonIntensity,
    CarbonIntensityError,
    carbon_intensity,
    co2e_g,
)
from edgebench.report.commands import report_command
from layout_checks import in_terminal
from results_fixtures import FakeRun, store_of

STEP_S = 0.2


def codecarbon_emissions_kg(energy_kwh: float, intensity_g_per_kwh: float) -> float:
    """codecarbon's `emissions = C x E` (docs/explanation/methodology.md), in its unit, kg CO2e:
    the energy in kWh times the grid's intensity in g/kWh, over 1000 g a kg."""
    return energy_kwh * intensity_g_per_kwh / 1000


@pytest.mark.parametrize("joules, intensity", [(3.6e6, 475.0), (1.0, 475.0), (1000.0, 56.0), (12.5, 820.0),
                                               (0.0, 475.0), (5.0, 0.0)])
def test_grams_are_what_codecarbons_formula_gives(joules, intensity):
    assert co2e_g(joules, intensity) == pytest.approx(1000 * codecarbon_emissions_kg(joules / 3.6e6, intensity))


def test_known_values_and_missing_energy_gives_no_co2():
    assert co2e_g(3.6e6, DEFAULT_G_PER_KWH) == pytest.approx(475.0)  # one kWh on the world-average grid
    assert co2e_g(1000.0, 56.0) == pytest.approx(0.015556, rel=1e-4)  # a kJ on a low-carbon grid
    assert co2e_g(None, 475.0) is None and co2e_g(math.nan, 475.0) is None


def test_the_option_beats_the_environment_which_beats_the_default():
    assert carbon_intensity(None, {}) == CarbonIntensity(475.0, None)
    assert carbon_intensity(None, {}).as_json()["source"] == "default"
    assert carbon_intensity(None, {ENV: " 56 "}) == CarbonIntensity(56.0, ENV)
    assert carbon_intensity(100.0, {ENV: "56"}) == CarbonIntensity(100.0, "--carbon-intensity")
    assert carbon_intensity(None, {ENV: "0"}).g_per_kwh == 0.0  # a grid without emissions is a value
    assert carbon_intensity(None, {ENV: ""}).source == "default"  # set but empty: the default
    for bad in ("lots", "-1", "nan", "inf"):
        with pytest.raises(CarbonIntensityError, match=f"{ENV}=.*set it to your grid's intensity, or unset it"):
            carbon_intensity(None, {ENV: bad})


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    """pi: measured power (4 W), phone: only its power model's (4 W, estimated), bare: no power at all;
    every step STEP_S, so 0.8 J a step measured on pi and estimated on phone."""
    def run(run_id, method, **power):
        return FakeRun(run_id=run_id, method=method, step_s=STEP_S, **power)

    return store_of(tmp_path_factory.mktemp("carbon"), {
        "pi": [run("a", "sgd", power=lambda t: 4.0 + 0 * t), run("b", "adamw", power=lambda t: 4.0 + 0 * t)],
        "phone": [run("c", "sgd", power=None, power_est=lambda t: 4.0 + 0 * t)],
        "bare": [run("d", "sgd", power=None, temp=None)],
    })


def _invoke(*args, env=None):
    result = CliRunner().invoke(report_command, list(args), env=env or {}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _grams(joules, intensity=DEFAULT_G_PER_KWH):
    return joules / 3.6e6 * intensity


def test_csv_and_json_carry_the_co2_beside_energy_with_the_intensity_and_its_source(store_path):
    data = json.loads(_invoke("--store", str(store_path), "--json"))
    columns = data["columns"]
    for energy, co2 in CO2_OF.items():  # each CO2 right beside its energy, named an estimate
        assert columns[columns.index(energy) + 1] == co2 and co2.startswith("co2e_est_")
    assert data["carbon_intensity"] == {"g_per_kwh": 475.0, "source": "default", "set_by": None,
                                        "what": "475 g CO2e/kWh, codecarbon's world average (IEA, Global Energy & "
                                                "CO2 Status Report 2019)", "estimate": True}
    runs = {r["device"] + r["run_id"]: r for r in data["runs"]}
    table = {r["device"] + r["run_id"]: r for r in csv.DictReader(io.StringIO(
        _invoke("--store", str(store_path), "--format", "csv")))}
    assert list(next(iter(table.values()))) == columns
    for key in runs:
        js, row = runs[key], table[key]
        assert (js["carbon_intensity_g_per_kwh"], js["carbon_intensity_source"]) == (475.0, "default")
        assert (row["carbon_intensity_g_per_kwh"], row["carbon_intensity_source"]) == ("475.0", "default")
        for energy, co2 in CO2_OF.items():  # CO2 follows its energy: measured, estimated or missing
            if js[energy] is None:
                assert js[co2] is None and row[co2] == "", (key, co2)
            else:
                assert js[co2] == pytest.approx(_grams(js[energy])) == float(row[co2]), (key, co2)
    pi, phone, bare = runs["pia"], runs["phonec"], runs["bared"]
    assert pi["energy_per_step_j"] == pytest.approx(4.0 * STEP_S, rel=1e-3)
    assert pi["co2e_est_per_step_g"] == pytest.approx(_grams(0.8), rel=1e-3) and pi["co2e_est_per_step_g_est"] is None
    assert pi["co2e_est_per_sample_g"] == pytest.approx(_grams(0.8) / 2, rel=1e-3)  # batch 2
    assert phone["co2e_est_per_step_g"] is None  # never in the measured energy's column
    assert phone["co2e_est_per_step_g_est"] == pytest.approx(_grams(0.8), rel=1e-3)
    assert all(bare[co2] is None for co2 in CO2_OF.values())
    pi_sgd = next(g for g in data["configurations"] if (g["device"], g["method"]) == ("pi", "sgd"))
    assert pi_sgd["co2e_est_per_step_g"] == pytest.approx(pi["co2e_est_per_step_g"])
    assert pi_sgd["spread"]["co2e_est_per_step_g"]["n"] == 1


def test_the_option_and_the_environment_change_it_and_say_so(store_path):
    def pi_a(*args, env=None):
        data = json.loads(_invoke("--store", str(store_path), "--json", *args, env=env))
        return data["carbon_intensity"], next(r for r in data["runs"] if (r["device"], r["run_id"]) == ("pi", "a"))

    default, run = pi_a()
    intensity, changed = pi_a("--carbon-intensity", "56")
    assert (intensity["g_per_kwh"], intensity["source"], intensity["set_by"]) == (56.0, "user", "--carbon-intensity")
    assert changed["co2e_est_per_step_g"] == pytest.approx(run["co2e_est_per_step_g"] * 56 / 475)
    assert changed["energy_per_step_j"] == run["energy_per_step_j"]  # the energy stays what was measured
    assert (changed["carbon_intensity_g_per_kwh"], changed["carbon_intensity_source"]) == (56.0, "user")
    intensity, from_env = pi_a(env={ENV: "820"})
    assert (intensity["g_per_kwh"], intensity["set_by"]) == (820.0, ENV)
    assert from_env["co2e_est_per_step_g"] == pytest.approx(run["co2e_est_per_step_g"] * 820 / 475)
    intensity, both = pi_a("--carbon-intensity", "0", env={ENV: "820"})  # the option wins
    assert (intensity["g_per_kwh"], intensity["set_by"], both["co2e_est_per_step_g"]) == (0.0, "--carbon-intensity", 0)
    csv_rows = list(csv.DictReader(io.StringIO(_invoke("--store", str(store_path), "--format", "csv",
                                                       "--carbon-intensity", "56"))))
    row = next(r for r in csv_rows if (r["device"], r["run_id"]) == ("pi", "a"))
    assert float(row["co2e_est_per_step_g"]) == pytest.approx(changed["co2e_est_per_step_g"])
    assert (row["carbon_intensity_g_per_kwh"], row["carbon_intensity_source"]) == ("56.0", "user")


def test_terminal_and_html_label_it_an_estimate_with_the_intensity(store_path, tmp_path):
    text = in_terminal(report_command, ["--store", str(store_path), "--device", "pi"], width=160)
    assert "CO2e mg/step (est.)" in text and "J/step" in text
    mg = 1000 * _grams(0.8)  # 0.106 mg a step
    assert f"{mg:.3g}" in text
    said = " ".join(text.split())
    assert "CO2e mg: milligrams of CO2-equivalent, an estimate: energy in kWh x the grid's carbon intensity, here " \
           "475 g CO2e/kWh, codecarbon's world average" in said
    user = " ".join(in_terminal(report_command, ["--store", str(store_path), "--device", "pi", "--carbon-intensity",
                                                 "56"], width=160).split())
    assert f"{mg * 56 / 475:.3g}" in user and "here 56 g CO2e/kWh, set by --carbon-intensity" in user
    phone = in_terminal(report_command, ["--store", str(store_path), "--device", "phone"], width=160)
    assert f"{mg:.3g} est" in phone  # from the power model's energy: est, as the joules beside it
    bare = in_terminal(report_command, ["--store", str(store_path), "--device", "bare"], width=160)
    assert "CO2e" not in bare  # no energy, no CO2 (and no legend for it)
    out = tmp_path / "report.html"
    _invoke("--store", str(store_path), "--format", "html", "--out", str(out), "--carbon-intensity", "56")
    html = out.read_text()
    assert '<th class="est">CO2e mg/step (est.)</th>' in html and '<th class="est">CO2e mg/step (est., from est. J)' \
        in html
    assert "CO2e is always an\nestimate: energy x the grid's carbon intensity, 56 g CO2e/kWh, set by " \
           "--carbon-intensity" in html
    assert f"{mg * 56 / 475:.3g}" in html


def test_study_carries_it_beside_energy(store_path):
    data = json.loads(_invoke("--store", str(store_path), "--study", "--json", "--carbon-intensity", "100"))
    assert (data["carbon_intensity"]["g_per_kwh"], data["carbon_intensity"]["source"]) == (100.0, "user")
    columns = data["columns"]
    assert columns[columns.index("energy_per_step_j") + 1] == "co2e_est_per_step_g"
    rows = {(r["device"], r["method"]): r for r in data["rows"]}
    adamw, phone = rows[("pi", "adamw")], rows[("phone", "sgd")]
    assert adamw["co2e_est_per_step_g"] == pytest.approx(_grams(adamw["energy_per_step_j"], 100))
    assert phone["co2e_est_per_step_g"] is None
    assert phone["co2e_est_per_step_g_est"] == pytest.approx(_grams(phone["energy_per_step_j_est"], 100))
    assert (adamw["carbon_intensity_g_per_kwh"], adamw["carbon_intensity_source"]) == (100.0, "user")
    table = list(csv.DictReader(io.StringIO(_invoke("--store", str(store_path), "--study", "--format", "csv"))))
    sgd = next(r for r in table if (r["device"], r["method"]) == ("pi", "sgd"))
    assert float(sgd["co2e_est_per_step_g"]) == pytest.approx(_grams(float(sgd["energy_per_step_j"])))
    text = " ".join(in_terminal(report_command, ["--store", str(store_path), "--study", "--device", "pi"]).split())
    assert f"0.8 J ({1000 * _grams(0.8):.3g} mg CO2e est.)" in text  # beside the baseline's joules
    assert "here 475 g CO2e/kWh, codecarbon's world average" in text


def test_the_co2_to_the_target_follows_its_energy(tmp_path):
    from edgebench.report.build import collect
    from edgebench.results.store import Store
    from report_demo import demo_store

    with Store(demo_store(tmp_path), read_only=True) as store:
        rows = collect(store, figures=False, carbon=CarbonIntensity(200.0, "--carbon-intensity")).rows
    reached = [r for r in rows if r.get("energy_to_target_j_est") is not None]
    assert reached and all(r["co2e_est_to_target_g_est"] == pytest.approx(_grams(r["energy_to_target_j_est"], 200))
                           for r in reached)
    assert all(r["co2e_est_to_target_g"] is None for r in rows if r["energy_to_target_j"] is None)


@pytest.mark.parametrize("args, env, says", [
    (["--carbon-intensity", "-1"], {}, "Invalid value for '--carbon-intensity': '-1' is not a finite number of 0 or "
                                       "more: grams of CO2e per kWh"),
    (["--carbon-intensity", "nan"], {}, "'--carbon-intensity': 'nan' is not a finite number"),
    (["--carbon-intensity", "inf"], {}, "'--carbon-intensity': 'inf' is not a finite number"),
    (["--carbon-intensity", "lots"], {}, "'--carbon-intensity': 'lots' is not a number of 0 or more: grams of CO2e"),
    ([], {ENV: "lots"}, f"{ENV}='lots' is not a finite number of 0 or more (g CO2e per kWh, e.g. 475); set it to "
                        "your grid's intensity, or unset it for the default"),
    ([], {ENV: "-3"}, f"{ENV}='-3' is not a finite number"),
])
def test_bad_intensities_are_refused_in_one_line_with_exit_code_2(args, env, says, store_path, capsys, monkeypatch):
    from edgebench.cli import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as ended:
        main(["report", "--store", str(store_path), *args])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert says in err, err


def test_the_docs_state_the_default_the_variable_and_the_option():
    from pathlib import Path

    root = Path(__file__).parents[1]
    for doc in ("README.md", "docs/figures.md"):
        text = " ".join((root / doc).read_text().split())
        assert f"{DEFAULT_G_PER_KWH:g}" in text and ENV in text and "--carbon-intensity" in text, doc
        assert "codecarbon" in text and "world average" in text, doc
