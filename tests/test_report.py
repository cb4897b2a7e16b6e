"""Reports: terminal tables, PNG figures, one offline HTML file, CSV/JSON that match the store."""

from __future__ import annotations

import csv
import io
import json
import re
from html import unescape
from html.parser import HTMLParser

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from edgebench.report import plots
from edgebench.report.commands import report_command
from edgebench.results.store import Store
from layout_checks import in_terminal, names_beside_figures
from results_fixtures import FakeRun, store_of

RUNS = {  # device -> [(run_id, method, rss MiB, step s, status, power measured?)]
    "pi": [
        ("a", "adamw", 300, 0.2, "ok", True),
        ("b", "sgd", 200, 0.3, "ok", True),
        ("c", "mezo", 350, 0.4, "oom", True),
    ],
    "phone": [("a", "adamw", 320, 0.25, "ok", False), ("d", "lora", 220, 0.35, "ok", False)],
}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    runs = {device: [FakeRun(run_id=run_id, method=method, rss_base=rss << 20, step_s=step_s, status=status,
                             power=(lambda t: 3.0 + 0.1 * t) if measured else None,
                             power_est=None if measured else (lambda t: 4.0 + 0 * t), throttle_after_s=1.5)
                     for run_id, method, rss, step_s, status, measured in device_runs]
            for device, device_runs in RUNS.items()}

    def sampler(run):  # the sampler's summary: what measured power_w covers, and a flag
        if run.power is None or run.status != "ok":
            return None
        flags = {"power_flags": ["charging"], "power_warning": CHARGING} if run.method == "sgd" else {"power_flags": []}
        return {"sampler": {"power_source": "ina3221", "power_total": "VDD_IN", **flags}}

    return store_of(tmp_path_factory.mktemp("report"), runs, sampler)


CHARGING = "the battery is charging: USB provides part of the power; unplug USB"


def _invoke(*args):
    result = CliRunner().invoke(report_command, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_png_figures_decode_with_the_expected_sizes(store_path, tmp_path):
    _invoke("--store", str(store_path), "--format", "png", "--out", str(tmp_path / "figs"))
    files = {p.name: p for p in (tmp_path / "figs").glob("*.png")}
    n_runs = sum(len(v) for v in RUNS.values())
    assert len(files) == len(RUNS) + 1 + 2 * n_runs  # a frontier per device/model, the comparison, 2 per run
    expected = {"pareto": plots.PARETO_SIZE, "memory": plots.TIMELINE_SIZE, "power": plots.POWER_SIZE,
                "compare": plots.COMPARE_SIZE}
    for name, path in files.items():
        inches = expected[name.split("_")[0]]
        with Image.open(path) as img:
            img.load()
            assert img.format == "PNG" and img.size == (inches[0] * plots.DPI, inches[1] * plots.DPI), name
            assert len(img.getcolors(1 << 20) or range(1000)) > 20, f"{name} looks blank"


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]


def _charts(html: str) -> dict[str, dict]:
    """Each chart of the page by name: the plotly figure in the JSON beside its div."""
    charts = {name: json.loads(data) for name, data in
              re.findall(r'<script type="application/json" id="data-([^"]+)">(.*?)</script>', html, re.S)}
    assert set(re.findall(r'<div class="chart" id="chart-[^"]+" data-chart="([^"]+)">', html)) == set(charts)
    return charts


def _chart_texts(fig: dict) -> set[str]:
    """What a chart says in text: trace names, category names and each line of its tooltips."""
    texts = set()
    for trace in fig["data"]:
        lines = [trace.get("name") or "", *(v for v in trace.get("y", []) if isinstance(v, str))]
        lines += [line for text in trace.get("hovertext") or [] if text for line in text.split("<br>")]
        lines += [line for meta in trace.get("meta") or [] for line in meta.split("<br>")]
        texts |= {unescape(line.replace("<br>", " ")) for line in lines}
    return texts


def test_html_is_one_offline_file_with_every_run(store_path, tmp_path):
    from plotly.offline import get_plotlyjs

    out = tmp_path / "report.html"
    _invoke("--store", str(store_path), "--format", "html", "--out", str(out))
    html = out.read_text()
    for device, runs in RUNS.items():
        for run_id, *_ in runs:
            assert f'id="run-{device}-{run_id}"' in html
    assert html.count(get_plotlyjs()) == 1  # plotly.js inlined once (its own code holds links it never loads)
    page = html.replace(get_plotlyjs(), "")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "http://" not in page and "https://" not in page  # nor in any chart's figure
    parser = _Refs()
    parser.feed(html)
    assert not {"link", "img", "iframe", "object", "embed"} & set(parser.tags)
    assert all(r.startswith("#") for r in parser.refs)  # the contents' links inside the file: nothing loaded
    charts = _charts(html)
    n_runs = sum(len(v) for v in RUNS.values())
    assert len(charts) == len(RUNS) + 3 + 2 * n_runs  # a frontier per device/model, 3 comparisons, 2 per run
    assert all(fig["data"] for fig in charts.values())
    assert "J/step (est.)" in html
    phone = _chart_texts(charts["pareto_phone_tiny-0"])  # the phone's power is only estimated
    assert charts["pareto_phone_tiny-0"]["layout"]["coloraxis"]["colorbar"]["title"]["text"].endswith("ESTIMATED)")
    assert any(re.fullmatch(r"energy per step: [\d.]+ J \(estimated\) \[.*\], n=1", t) for t in phone), phone
    assert not any(t.endswith("(estimated)") for t in _chart_texts(charts["pareto_pi_tiny-0"]))
    assert "power covers" in html and "VDD_IN" in html and "power flagged charging" in html  # what W covers


def _store_truth(store_path):
    with Store(store_path, read_only=True) as store:
        q = store.con.execute
        runs = {(d, r): s for d, r, s in q("SELECT device, run_id, status FROM runs").fetchall()}
        median = dict(((d, r), m) for d, r, m in q("""SELECT device, run_id, median(duration_s) FROM steps_host
            WHERE phase = 'measure' GROUP BY ALL""").fetchall())
        rss = dict(
            ((d, r), m)
            for d, r, m in q("SELECT device, run_id, max(rss_bytes) FROM samples_host GROUP BY ALL").fetchall()
        )
    return runs, median, rss


def test_csv_and_json_match_the_store(store_path):
    runs, median, rss = _store_truth(store_path)
    rows = list(csv.DictReader(io.StringIO(_invoke("--store", str(store_path), "--format", "csv"))))
    data = json.loads(_invoke("--store", str(store_path), "--json"))
    assert {(r["device"], r["run_id"]) for r in rows} == set(runs) == {(r["device"], r["run_id"]) for r in data["runs"]}
    for row, js in zip(rows, data["runs"]):
        key = (row["device"], row["run_id"])
        assert row["status"] == js["status"] == runs[key]
        assert float(row["step_time_median_s"]) == pytest.approx(median[key]) == js["step_time_median_s"]
        assert float(row["peak_rss_bytes_sampled"]) == pytest.approx(rss[key]) == js["peak_rss_bytes_sampled"]
        if key[0] == "phone":  # estimated power only: never reported as measured
            assert row["energy_per_step_j"] == "" and js["energy_per_step_j"] is None
            assert float(row["energy_per_step_j_est"]) == pytest.approx(4.0 * js["step_time_median_s"])
        else:
            assert row["energy_per_step_j_est"] == "" and float(row["energy_per_step_j"]) > 0
    assert data["columns"] == list(rows[0].keys())


def test_terminal_report_and_filters(store_path):
    text = _invoke("--store", str(store_path), "--device", "phone")
    assert "lora" in text and "mezo" not in text and " est" in text
    assert "phone: no power sensor; power and energy are estimated from its power model" in text
    assert "Clock alignment" in text  # no probes in this store: the report says the clock is the device's own
    assert plots._energy_colour([{"energy_per_step_j": None, "energy_per_step_j_est": 1.0}])[1].endswith("ESTIMATED)")


def test_power_shows_what_it_covers_and_its_flags_in_every_format(store_path):
    """Measured power with what the sampler says it covers (VDD_IN) and its flags (charging);
    the estimate labelled est; at 80 columns, in CSV and JSON (HTML: the test above)."""
    text = in_terminal(report_command, ["--store", str(store_path)])
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in text
    assert "pi: power measured; it covers VDD_IN" in text
    assert f"pi / tiny / sgd / eager: power flagged charging: {CHARGING}" in " ".join(line.strip() for line in lines)
    assert re.search(r"\b3\.\d+ charging\b", text)  # sgd's mean power over its measured steps, flagged
    phone = _invoke("--store", str(store_path), "--device", "phone")
    assert re.search(r"\b4 est\b", phone)  # the power model's 4 W, labelled an estimate
    rows = {(r["device"], r["run_id"]): r for r in csv.DictReader(io.StringIO(
        _invoke("--store", str(store_path), "--format", "csv")))}
    assert (rows[("pi", "b")]["power_covers"], rows[("pi", "b")]["power_flags"]) == ("VDD_IN", "charging")
    assert rows[("pi", "a")]["power_flags"] == "" and rows[("phone", "a")]["power_covers"] == ""
    assert float(rows[("pi", "a")]["power_mean_w"]) > 3.0 and rows[("phone", "a")]["power_mean_w"] == ""
    assert float(rows[("phone", "a")]["power_mean_w_est"]) == pytest.approx(4.0)
    data = json.loads(_invoke("--store", str(store_path), "--json"))
    pi_sgd = next(g for g in data["configurations"] if (g["device"], g["method"]) == ("pi", "sgd"))
    assert (pi_sgd["power_covers"], pi_sgd["power_flags"], pi_sgd["power_warning"]) == ("VDD_IN", "charging", CHARGING)


def test_report_on_a_missing_store_says_what_to_do(tmp_path, store_path):
    result = CliRunner().invoke(report_command, ["--store", str(tmp_path / "none.duckdb")])
    assert result.exit_code != 0 and "edgebench ingest" in result.output
    Store(tmp_path / "empty.duckdb").close()
    empty = CliRunner().invoke(report_command, ["--store", str(tmp_path / "empty.duckdb")])
    said = " ".join(empty.output.split())
    assert empty.exit_code == 1 and "empty.duckdb: no runs yet; add some" in said and "None" not in said
    # every way in: a quick benchmark of this host beside a device's sweep and run files copied by hand
    assert all(way in said for way in ("`edgebench bench --device local --model tiny` (a quick benchmark",
                                       "`edgebench deploy --device NAME` then `edgebench collect`",
                                       "`edgebench ingest RUN_DIR`"))
    assert f"with --store {tmp_path / 'empty.duckdb'}" in said  # not the default store: bench must be told
    other = CliRunner().invoke(report_command, ["--store", str(store_path), "--device", "watch"])
    said = " ".join(other.output.split())
    assert "no runs of device 'watch'; add some" in said and "and model" not in said  # no model was asked


def test_report_of_no_matching_runs_is_a_user_error(tmp_path, capsys):
    """Through `edgebench`: one line and exit code 2 (report.output.ReportError), not an internal error."""
    from edgebench.cli import main

    Store(tmp_path / "empty.duckdb").close()
    with pytest.raises(SystemExit) as ended:
        main(["report", "--store", str(tmp_path / "empty.duckdb"), "--model", "tiny"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "no runs of model 'tiny'; add some" in err


# ---- readable at a glance: layouts, repeats, the noise guard, the study -------------------------
def _lines(renderable, width):
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def _repeat_store(root, long_model=None):
    """pi: adamw x3 (0.2, 0.25, 0.3 s/step; the second disturbed), sgd x2, mezo x1 (oom)."""
    path = root / "edgebench.duckdb"
    model = long_model or "tiny"
    with Store(path) as store:
        for i, (method, rss, step_s, status) in enumerate([
                ("adamw", 300, 0.2, "ok"), ("adamw", 310, 0.25, "ok"), ("adamw", 320, 0.3, "ok"),
                ("sgd", 200, 0.1, "ok"), ("sgd", 210, 0.12, "ok"), ("mezo", 150, 0.4, "oom")]):
            run = FakeRun(run_id=f"r{i}", model=model, method=method, rss_base=rss << 20, step_s=step_s,
                          status=status, power=lambda t: 4.0 + 0 * t)
            run_dir = run.write(root / "src")
            if i == 1:  # the noise guard's record, as the supervisor writes it
                result = json.loads((run_dir / "result.json").read_text())
                result["cpu"] = {"others_share": 0.42, "steal_share": 0.0, "load_1m": 5.1, "disturbed": True,
                                 "disturbed_why": "other processes used 42% of the CPU"}
                (run_dir / "result.json").write_text(json.dumps(result))
            store.ingest_run(run_dir, device="pi")
    return path


@pytest.fixture(scope="module")
def repeat_store(tmp_path_factory):
    """The repeats store, built once for the tests that only read it."""
    return _repeat_store(tmp_path_factory.mktemp("repeats"))


@pytest.mark.parametrize("width", [80, 100, 120])
def test_terminal_report_fits_the_window_with_every_key_figure(repeat_store, width):
    from edgebench.report.build import collect
    from edgebench.report.tables import terminal_report

    with Store(repeat_store, read_only=True) as store:
        report = collect(store, figures=False)
    lines = _lines(terminal_report(report.rows, report.runs, width=width), width)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= width and "…" not in text
    assert not any(line.startswith("#1 ") for line in lines)  # a table at every width, never a card a row
    compact = width < 120  # short headers, their units in one line below the table; at 80 the CO2 left out first
    header = next(line for line in lines if line.split()[:1] == ["method"]).split()
    assert header == ["method", "status", "n", *(["peak", "t", "E", *["CO2"] * (width > 80), "P"] if compact else
                                                 ["peak", "MiB", "step", "s", "J/step", "CO2e", "mg/step", "(est.)",
                                                  "W"]), "loss"]
    assert ("peak: MiB; t: s/step; E: J/step; P: W" in lines) == (width == 80)
    assert ("peak: MiB; t: s/step; E: J/step; CO2: mg CO2e/step (est.); P: W" in lines) == (width == 100)
    for word in ("tiny", "adamw", "sgd", "mezo", "eager", "oom"):
        assert word in text, word
    names_beside_figures(lines, ["adamw", "sgd", "mezo"])
    assert "0.25 [0.2-0.3]" in text  # adamw: the median of 3 runs with its min-max
    assert "10->3.49 -65%" in text  # the loss and how much it fell, beside the other figures
    assert "ok !" in text and "1 of 6 runs, in 1 configuration marked !, were disturbed: other processes or " \
        "steal took 42% of the CPU" in " ".join(line.strip() for line in lines)


def test_long_names_wrap_whole_never_cut_cards_only_where_no_table_fits(tmp_path):
    """The long model every row shares heads the table (folded whole); at 40 columns not even the
    compact table fits: a card per configuration."""
    from edgebench.report.build import collect
    from edgebench.report.tables import terminal_report

    model = "/home/user/checkpoints/nanoVLM-222M-finetuned-on-my-own-data-" + "x" * 40
    with Store(_repeat_store(tmp_path, long_model=model), read_only=True) as store:
        report = collect(store, figures=False)
    for width in (80, 40):
        lines = _lines(terminal_report(report.rows, report.runs, width=width), width)
        assert max(len(line) for line in lines) <= width and "…" not in "".join(lines)
        assert model in "".join(line.strip() for line in lines)  # folded across lines, every character kept
        assert any(line.startswith("#1 ") for line in lines) == (width == 40)  # the card layout
        names_beside_figures(lines, ["adamw", "sgd", "mezo"])


def test_repeats_fold_into_median_min_max_and_n(repeat_store):
    from edgebench.results.aggregate import group_runs
    from edgebench.results.metrics import all_metrics

    with Store(repeat_store, read_only=True) as store:
        groups = {g["method"]: g for g in group_runs(all_metrics(store))}
    adamw, sgd, mezo = groups["adamw"], groups["sgd"], groups["mezo"]
    assert adamw["n"] == 3 and adamw["spread"]["step_time_median_s"] == pytest.approx(
        {"median": 0.25, "min": 0.2, "max": 0.3, "n": 3})
    assert adamw["disturbed"] == 1 and sgd["disturbed"] == 0
    assert sgd["n"] == 2 and sgd["step_time_median_s"] == pytest.approx(0.11)
    assert mezo["status"] == "oom" and mezo["n"] == 1 and mezo["on_frontier"] is None
    assert adamw["on_frontier"] is False and sgd["on_frontier"] is True  # sgd: less memory and faster


def test_study_ratios_to_the_baseline_in_every_format(repeat_store, tmp_path):
    path = repeat_store
    data = json.loads(_invoke("--store", str(path), "--study", "--baseline", "sgd", "--format", "json"))
    rows = {r["method"]: r for r in data["rows"]}
    adamw = rows["adamw"]
    assert adamw["step_time_ratio"] == pytest.approx(0.25 / 0.11)
    assert adamw["step_time_ratio_min"] == pytest.approx(0.2 / 0.12)
    assert adamw["step_time_ratio_max"] == pytest.approx(0.3 / 0.1)
    sgd_peak = np.median([(200 << 20) + (15 << 20), (210 << 20) + (15 << 20)])  # kernel peak: base + 11 + 4 MiB
    assert adamw["peak_mem_ratio"] == pytest.approx(((310 << 20) + (15 << 20)) / sgd_peak)
    assert adamw["energy_ratio"] == pytest.approx(0.25 / 0.11, rel=1e-3) and adamw["energy_estimated"] is False
    assert (adamw["n"], adamw["n_baseline"]) == (3, 2)
    assert rows["sgd"]["step_time_ratio"] == pytest.approx(1.0)
    assert rows["mezo"]["step_time_ratio"] is None and rows["mezo"]["status"] == "oom"
    table = list(csv.DictReader(io.StringIO(_invoke("--store", str(path), "--study", "--format", "csv"))))
    assert float(next(r for r in table if r["method"] == "adamw")["step_time_ratio"]) == pytest.approx(0.25 / 0.11)
    text = in_terminal(report_command, ["--store", str(path), "--study"])
    assert "2.27x [1.67-3.00]" in text and "baseline sgd" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    names_beside_figures(text.splitlines(), ["adamw", "sgd", "mezo"])
    html_path = tmp_path / "study.html"
    _invoke("--store", str(path), "--study", "--format", "html", "--out", str(html_path))
    html = html_path.read_text()
    assert "Study: each method against the baseline" in html and "2.27x [1.67-3.00]" in html
    study_part = html.split('id="study"')[1].split('id="configurations"')[0]
    assert 'data-chart="pareto_pi_tiny-0"' in study_part  # the Pareto frontier above the study's table
    assert html.count('data-chart="pareto_pi_tiny-0"') == 1  # and not again among the figures
    missing = json.loads(_invoke("--store", str(path), "--study", "--baseline", "lora", "--json"))
    assert "no finished lora run" in missing["notes"][0]


def test_predicted_peak_beside_the_measured_with_its_error_in_report_study_and_html(tmp_path):
    """A run's predicted peak (est. MiB) beside its measured kernel peak, with (predicted -
    measured) / measured; `-` where a run has no prediction."""
    path = tmp_path / "edgebench.duckdb"
    with Store(path) as store:
        for run_id, method, rss, predicted in (("p", "adamw", 300, 330 << 20), ("q", "sgd", 200, None)):
            run = FakeRun(run_id=run_id, method=method, rss_base=rss << 20, predicted_peak=predicted)
            store.ingest_run(run.write(tmp_path / "src"), device="pi")
    error = 100 * (330 - 315) / 315  # the kernel peak: base + 11 steps' MiB + 4 MiB
    runs = {r["method"]: r for r in json.loads(_invoke("--store", str(path), "--json"))["runs"]}
    assert runs["adamw"]["predicted_peak_bytes_est"] == 330 << 20
    assert runs["adamw"]["predicted_peak_error_pct"] == pytest.approx(error)
    assert runs["sgd"]["predicted_peak_bytes_est"] is None and runs["sgd"]["predicted_peak_error_pct"] is None

    def cells(text: str, *headers: str) -> dict[str, tuple[str, ...]]:
        """Each row's cells under `headers` (right-aligned: a cell ends where its header does)."""
        lines = text.splitlines()
        head = next(line for line in lines if all(h in line for h in headers))
        ends = [head.index(h) + len(h) for h in headers]
        return {m: tuple(line[:end].split()[-1] for end in ends) for m in ("adamw", "sgd")
                for line in lines if line.lstrip().startswith(m + " ")}

    from edgebench.report.build import collect
    from edgebench.report.study import study_terminal
    from edgebench.report.tables import terminal_report

    with Store(path, read_only=True) as store:
        report = collect(store, figures=False, baseline="sgd")
    for shown in (terminal_report(report.rows, report.runs, width=120),
                  study_terminal(report.study, report.study_notes, width=120)):
        text = "\n".join(_lines(shown, 120))
        assert cells(text, "peak MiB", "est. MiB", "est. err") == {"adamw": ("315", "330", "+4.8%"),
                                                                   "sgd": ("215", "-", "-")}
        assert "est. err: its error against the measured kernel peak, (predicted - measured) / measured" in \
            " ".join(text.split())
    narrow = _lines(terminal_report(report.rows, report.runs, width=80), 80)  # the compact table, units below
    assert max(len(line) for line in narrow) <= 80
    assert cells("\n".join(narrow), "peak", "est.", "err") == {"adamw": ("315", "330", "+4.8%"),
                                                              "sgd": ("215", "-", "-")}
    assert "peak, est.: MiB; err: %; t: s/step; E: J/step; CO2: mg CO2e/step (est.); P: W" in narrow
    rows = {r["method"]: r for r in json.loads(_invoke("--store", str(path), "--study", "--json"))["rows"]}
    assert rows["adamw"]["predicted_peak_error_pct"] == pytest.approx(error)
    assert rows["sgd"]["predicted_peak_error_pct"] is None
    html_path = tmp_path / "report.html"
    _invoke("--store", str(path), "--study", "--format", "html", "--out", str(html_path))
    html = html_path.read_text()
    for section in ("study", "configurations", "runs"):
        part = html.split(f'<h2 id="{section}"')[1].split("<h2")[0]
        assert re.search(r"<td[^>]*>315(\.\d)?</td><td[^>]*>330(\.0)?</td><td[^>]*>\+4\.8%?</td>", part), part[:200]
        assert re.search(r"<td[^>]*>215(\.\d)?</td><td[^>]*>-</td><td[^>]*>-</td>", part), part[:200]


def test_no_empty_panels_a_device_without_sensors_is_said_once(tmp_path):
    path = tmp_path / "edgebench.duckdb"
    with Store(path) as store:
        for run_id in ("x", "y"):
            run = FakeRun(run_id=run_id, power=None, temp=None)
            store.ingest_run(run.write(tmp_path / "src"), device="bare")
    _invoke("--store", str(path), "--format", "png", "--out", str(tmp_path / "figs"))
    names = sorted(p.name.split("_")[0] for p in (tmp_path / "figs").glob("*.png"))
    assert names == ["memory", "memory", "pareto"]  # no power/temperature figure without any figure to draw
    text = _invoke("--store", str(path))
    assert text.count("bare: no power sensor and no power model; no power or energy figures") == 1


# ---- every chart and table names what it shows: device, model, method, backend, shape -----------
TWO_MODELS = {  # device -> [(run_id, model, method, steps, rss MiB, step s)]
    "pi": [("a", "tiny", "sgd", 5, 200, 0.1), ("b", "tiny", "sgd", 10, 205, 0.1), ("c", "tiny", "adamw", 5, 300, 0.2),
           ("d", "nanovlm-222m", "sgd", 5, 2200, 3.0)],
    "phone": [("e", "tiny", "sgd", 5, 210, 0.15), ("f", "nanovlm-222m", "lora", 5, 900, 2.0)],
}


@pytest.fixture(scope="module")
def two_models_store(tmp_path_factory):
    """Two models on two devices, tiny sgd on pi at 5 and 10 steps (two configurations)."""
    return store_of(tmp_path_factory.mktemp("two_models"), {
        device: [FakeRun(run_id=run_id, model=model, method=method, steps=steps, rss_base=rss << 20, step_s=step_s,
                         power=None, power_est=lambda t: 4.0 + 0 * t)
                 for run_id, model, method, steps, rss, step_s in runs] for device, runs in TWO_MODELS.items()})


def _png_texts(png: bytes) -> str:
    """What the chart draws as text: the PNG's Description chunk (plots.png_bytes writes it)."""
    with Image.open(io.BytesIO(png)) as img:
        return img.text["Description"]


def test_every_chart_names_device_model_method_backend_and_the_shape_where_it_differs(two_models_store, tmp_path):
    _invoke("--store", str(two_models_store), "--format", "png", "--out", str(tmp_path / "figs"))
    texts = {p.stem: _png_texts(p.read_bytes()) for p in (tmp_path / "figs").glob("*.png")}
    compare = texts["compare_devices"].splitlines()
    for name in ("tiny / sgd / eager (steps 5)", "tiny / sgd / eager (steps 10)", "tiny / adamw / eager (steps 5)",
                 "nanovlm-222m / sgd / eager (steps 5)", "nanovlm-222m / lora / eager (steps 5)", "pi", "phone"):
        assert name in compare, name  # a bar's tick (model / method / backend (shape)) or a device's legend entry
    assert not any(t.startswith(("sgd", "lora", "adamw")) for t in compare), compare  # never a bar without its model
    pi_tiny = texts["pareto_pi_tiny"]
    assert "pi / tiny: peak memory vs time per step" in pi_tiny and "nanovlm" not in pi_tiny
    assert "sgd / eager (steps 5) n=1" in pi_tiny and "sgd / eager (steps 10) n=1" in pi_tiny
    assert "pi / nanovlm-222m: peak memory vs time per step" in texts["pareto_pi_nanovlm-222m"]
    for device, runs in TWO_MODELS.items():
        for run_id, model, method, steps, *_ in runs:
            assert f"{device} / {model} / {method} / eager (steps {steps}) (ok), run {run_id}" in \
                texts[f"memory_{device}_{run_id}"]
    for name, drawn in texts.items():  # estimated power only: no flat power panel per run, temperature alone
        if name.startswith("power_"):
            assert "W" not in drawn.splitlines() and "temperature: " in drawn and "power" not in drawn, drawn


def test_html_names_every_row_and_figure_and_has_contents(two_models_store, tmp_path):
    out = tmp_path / "report.html"
    _invoke("--store", str(two_models_store), "--format", "html", "--out", str(out))
    html = out.read_text()
    parser = _Refs()
    parser.feed(html)
    charts = _charts(html)
    compared = [_chart_texts(fig) for name, fig in charts.items() if name.startswith("compare_devices-")]
    assert len(compared) == 3  # time, memory, energy: a chart each
    for texts in compared:  # a bar's axis name (model / method / backend (shape)) and a device's legend entry
        assert {"nanovlm-222m / lora / eager (steps 5)", "tiny / sgd / eager (steps 10)", "pi", "phone"} <= texts
        assert not any(t.startswith(("sgd", "lora", "adamw")) for t in texts), texts  # never without its model
    for name, fig in charts.items():  # every point, bar and line hovers with what it is
        for trace in fig["data"]:
            assert trace.get("hoverinfo") != "skip" and (trace.get("hovertext") or trace.get("hovertemplate")), name
    pi_tiny = _chart_texts(charts["pareto_pi_tiny-0"])
    assert {"device: pi", "model: tiny", "method: sgd", "backend: eager", "run shape: steps 10"} <= pi_tiny
    assert {"sgd / eager (steps 5) n=1 ★", "sgd / eager (steps 10) n=1 ★"} <= pi_tiny  # legend: each its own shape's
    assert not any("nanovlm" in t for t in pi_tiny)
    assert any(re.fullmatch(r"time per step, median: 0\.1 s \[0\.1–0\.1\], n=1", t) for t in pi_tiny), pi_tiny
    memory = _chart_texts(charts["memory_phone_f-0"])
    assert {"device: phone", "model: nanovlm-222m", "method: lora", "run shape: steps 5", "run: f"} <= memory
    anchors = [r for r in parser.refs if r.startswith("#")]
    assert {"#configurations", "#runs", "#figures", "#fig-compare_devices"} <= set(anchors)
    assert all(f'id="{a[1:]}"' in html for a in anchors)  # every contents link lands
    assert "Memory timeline: phone / nanovlm-222m / lora / eager (steps 5) (ok), run f" in html
    configurations = html.split('id="configurations"')[1].split('id="runs"')[0]
    rows = re.findall(r"<tr>(.*?)</tr>", configurations)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    named = {tuple(c[:3]) + (c[5],) for c in cells if c}  # model, method, backend, shape (after status, n)
    assert ("nanovlm-222m", "sgd", "eager", "steps 5") in named and ("tiny", "sgd", "eager", "steps 10") in named


def test_terminal_report_keeps_configurations_of_other_steps_apart(two_models_store):
    text = in_terminal(report_command, ["--store", str(two_models_store)], 120)
    assert "steps 10" in text and "steps 5" in text and "Across devices" in text
    assert "nanovlm-222m / sgd / eager (steps 5)" in text  # the comparison's rows name the model


def test_one_frontier_that_asks_for_learning_in_bench_report_study_and_html(tmp_path):
    """mezo is the smallest and fastest but its loss rose: no star for it anywhere, and sgd,
    the best of the runs that learned, has one in bench, the report, the study and the HTML."""
    from edgebench.report.tables import bench_rows
    from edgebench.results.aggregate import group_runs

    path = tmp_path / "edgebench.duckdb"
    results = []
    with Store(path) as store:
        for method, rss, step_s, rate in (("adamw", 300, 0.3, 0.9), ("sgd", 250, 0.2, 0.9), ("mezo", 200, 0.1, 1.05)):
            run = FakeRun(run_id=method, method=method, rss_base=rss << 20, step_s=step_s, loss_rate=rate)
            results.append(run.result())
            store.ingest_run(run.write(tmp_path / "src"), device="pi")
    bench = {g["method"]: g["on_frontier"] for g in group_runs(bench_rows(results, device="pi"))}
    assert bench == {"adamw": False, "sgd": True, "mezo": False}
    study = {r["method"]: r for r in json.loads(_invoke("--store", str(path), "--study", "--json"))["rows"]}
    assert {m: r["on_frontier"] for m, r in study.items()} == bench
    assert study["mezo"]["loss_last"] > study["mezo"]["loss_first"]  # the loss beside the figures, in the study too
    report = json.loads(_invoke("--store", str(path), "--json"))
    assert {g["method"]: g["on_frontier"] for g in report["configurations"]} == bench
    assert {r["method"]: r["on_frontier"] for r in report["runs"]} == bench
    text = in_terminal(report_command, ["--store", str(path), "--study"])
    mezo = next(line for line in text.splitlines() if " mezo " in line)  # a row of the table: name and figures
    assert "10->16.3 +63%" in mezo and "★" not in mezo
    html_path = tmp_path / "r.html"
    _invoke("--store", str(path), "--study", "--format", "html", "--out", str(html_path))
    rows = re.findall(r"<tr>(.*?)</tr>", html_path.read_text().split('id="configurations"')[1].split('id="runs"')[0])
    starred = {re.findall(r"<td[^>]*>(.*?)</td>", row)[1] for row in rows if "★" in row}
    assert starred == {"sgd"}


def test_device_ram_is_the_cgroups_on_a_lab_device_and_the_workers_rss_is_named(tmp_path):
    """On a 512 MiB lab device the worker's kernel RSS (shared library pages) reads above the
    limit while the cgroup, which the limit applies to, stays below: the report's device RAM
    is the cgroup's, the RSS column says what it is."""
    run = FakeRun(rss_base=560 << 20, cgroup_limit_bytes=512 << 20)
    run_dir = run.write(tmp_path / "src")
    result = json.loads((run_dir / "result.json").read_text())
    result.update({"device_ram_peak_bytes": 500 << 20, "device_ram_limit_bytes": 512 << 20,
                   "device_ram_peak_what": "device RAM (its cgroup, page cache included)"})
    (run_dir / "result.json").write_text(json.dumps(result))
    path = tmp_path / "edgebench.duckdb"
    with Store(path) as store:
        store.ingest_run(run_dir, device="lab-pizero")
    row = json.loads(_invoke("--store", str(path), "--json"))["runs"][0]
    assert row["peak_mem_bytes"] > row["device_ram_limit_bytes"] > row["device_ram_peak_bytes"] == 500 << 20
    text = in_terminal(report_command, ["--store", str(path)])
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert next(line for line in lines if line.split()[:1] == ["method"]).split()[3:5] == ["peak", "RAM"]
    assert re.search(r" 575 +98% ", next(line for line in lines if line.startswith("adamw "))), lines
    assert any(line.startswith("peak: MiB; RAM: %; t: s/step;") for line in lines)


def test_a_device_without_a_sensor_says_once_what_its_estimate_is_built_from(tmp_path):
    basis = "the CPU use of its cgroup lab/pi4 (4 cores)"

    def sampler(run):  # the lab device's sampler: an estimate from its cgroup's CPU; run b disturbed
        return {"sampler": {"power_source": "estimate", "power_model": {"idle_w": 2.7, "max_w": 6.4},
                            "power_est_basis": basis},
                "cpu": {"others_share": 0.4, "disturbed": run.run_id == "b", "disturbed_why": "others used 40%"}}

    path = store_of(tmp_path, {"lab-pi4": [FakeRun(run_id=r, power=None, power_est=lambda t: 3.0 + 0 * t)
                                           for r in ("a", "b")]}, sampler)
    text = " ".join(line.strip() for line in _invoke("--store", str(path)).splitlines())
    assert text.count("lab-pi4: no power sensor") == 1
    assert (f"lab-pi4: no power sensor; power and energy are estimated from its power model (est): 2.7-6.4 W by "
            f"{basis}; in its 1 disturbed run(s) (!) the steps ran slowed, so their energy estimate reads high") in text


def test_study_puts_estimated_energy_in_est_columns_and_keeps_other_steps_apart(two_models_store):
    data = json.loads(_invoke("--store", str(two_models_store), "--study", "--json"))
    assert {"energy_per_step_j_est", "energy_ratio_est", "energy_ratio_min_est", "energy_ratio_max_est"} <= \
        set(data["columns"])
    pi_tiny = {(r["method"], r["steps"]): r for r in data["rows"] if (r["device"], r["model"]) == ("pi", "tiny")}
    adamw = pi_tiny[("adamw", 5)]
    assert adamw["energy_per_step_j"] is None and adamw["energy_ratio"] is None  # never in the measured columns
    assert adamw["energy_per_step_j_est"] == pytest.approx(4.0 * 0.2, rel=1e-3)
    assert adamw["energy_ratio_est"] == pytest.approx(2.0, rel=1e-3) and adamw["energy_estimated"] is True
    assert pi_tiny[("sgd", 10)]["n"] == 1 and pi_tiny[("sgd", 5)]["n"] == 1  # 5 and 10 steps: not one n=2 row
    assert pi_tiny[("sgd", 10)]["step_time_ratio"] == pytest.approx(1.0)  # its own setting, its own baseline
    csv_rows = list(
        csv.DictReader(io.StringIO(_invoke("--store", str(two_models_store), "--study", "--format", "csv")))
    )
    adamw_csv = next(r for r in csv_rows if (r["device"], r["model"], r["method"]) == ("pi", "tiny", "adamw"))
    assert adamw_csv["energy_ratio"] == "" and float(adamw_csv["energy_ratio_est"]) == pytest.approx(2.0, rel=1e-3)


def test_charts_have_no_overlapping_labels_no_cut_titles_no_legend_over_a_plot(two_models_store, tmp_path,
                                                                                 monkeypatch):
    """Measured with matplotlib's renderer as each PNG is saved: the comparison of 24 configurations
    on two devices (horizontal bars, a name a row), a frontier whose points sit at the right edge
    with long names, and every chart `report --format png` draws."""
    from layout_checks import chart_problems

    problems: list[tuple[str, list[str]]] = []
    save = plots.png_bytes

    def checked(fig):
        title = fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title()
        found = chart_problems(fig)
        if title.startswith(("power", "temperature")):  # panels of their own: legends in their corner
            found = [p for p in found if "legend" not in p]
        problems.append((title, found))
        return save(fig)

    monkeypatch.setattr(plots, "png_bytes", checked)

    def config(device, method, backend, peak, step_s, front=False, status="ok"):
        return {"device": device, "model": "tiny", "method": method, "backend": backend, "status": status, "n": 1,
                "peak_mem_bytes": peak << 20, "step_time_median_s": step_s, "energy_per_step_j_est": step_s * 4,
                "on_frontier": front, "loss_first": 10.0, "loss_last": 3.0, "spread": {}}

    methods = ["sgd", "adamw", "mezo", "lora", "lora+ckpt", "adamw+ckpt", "sgd+bf16", "adamw+bf16+accum4"]
    plots.compare_devices_figure([config(device, m, b, 200 + 10 * i, 0.1 + 0.02 * i)
                                  for device in ("lab-pi4", "jetson-orin-nano-8gb") for i, (m, b) in
                                  enumerate((m, b) for m in methods for b in ("eager", "onnxruntime", "executorch"))])
    plots.pareto_figure([config("pi", "adamw+ckpt+bf16+accum4", "executorch", 900, 0.9, front=True),
                         config("pi", "adamw", "executorch", 890, 0.89),
                         config("pi", "sgd", "eager", 200, 0.1, front=True),
                         config("pi", "sgd", "onnxruntime", 205, 0.102),
                         config("pi", "mezo", "eager", 880, 0.12, status="oom")], "pi / tiny: the right edge")
    _invoke("--store", str(two_models_store), "--format", "png", "--out", str(tmp_path / "figs"))
    assert len(problems) == 2 + len(list((tmp_path / "figs").glob("*.png")))
    assert [(title, found) for title, found in problems if found] == []


@pytest.fixture(scope="module")
def evaluated_store(tmp_path_factory):
    """report_demo's store: raspberry-pi-5's runs evaluated with the target loss=2.5 (sgd reaches
    it after 8 steps of 0.9 and 0.945 s, adamw after 4 of 1.0 s, lora never; 5 W estimated)."""
    from report_demo import demo_store

    return demo_store(tmp_path_factory.mktemp("evaluated"))


def test_heldout_figures_and_the_cost_to_the_target_in_report_and_study_tables(evaluated_store):
    def rows(lines):
        """The three rows under the table's header, by method, in their order."""
        table = lines[next(i for i, line in enumerate(lines) if line.split()[:1] == ["method"]) + 2:]
        return {line.split()[0]: line for line in table[:3]}

    lines = in_terminal(report_command, ["--store", str(evaluated_store), "--device", "raspberry-pi-5"]).splitlines()
    (header,) = [line.split() for line in lines if line.split()[:1] == ["method"]]
    # at 80 columns: the compact table, the steps to the target, held-out loss, joules, loss and J/step left out
    assert header == ["method", "status", "n", "peak", "t", "acc", "hit", "tgt"], lines
    got = rows(lines)
    assert got["sgd"].split()[-4:] == ["60%", "2/2", "7.38", "[7.2-7.56]"], got
    assert got["adamw"].split()[-3:] == ["30%", "1/1", "4"] and got["lora"].split()[-3:] == ["60%", "0/1", "-"]
    assert "acc: %; tgt: s to target" in " ".join(lines)
    wide = in_terminal(report_command, ["--store", str(evaluated_store), "--device", "raspberry-pi-5"], width=220)
    assert all(h in wide for h in ("held-out loss", "held-out acc", "reached", "steps to target", "s to target",
                                   "J to target"))
    assert "4->2.4 -40%" in wide and "36.9 [36-37.8] est" in wide  # held-out loss; joules from the power model
    plain = in_terminal(report_command, ["--store", str(evaluated_store), "--device", "pixel-8-termux"], width=220)
    assert "held-out" not in plain and "reached" not in plain and "target" not in plain  # no empty columns

    study = in_terminal(report_command, ["--store", str(evaluated_store), "--device", "raspberry-pi-5", "--study"])
    lines = study.splitlines()
    (header,) = [line.split() for line in lines if line.split()[:1] == ["method"]]
    assert header == ["method", "status", "n", "mem", "t", "acc", "hit", "Ttgt"], lines
    got = rows(lines)
    assert list(got) == ["adamw", "sgd", "lora"]  # ranked by time to the target; lora never reached it
    assert got["adamw"].split()[-2:] == ["0.54x", "[0.53-0.56]"] and got["lora"].split()[-1] == "-"
    said = " ".join(study.split())
    assert "Target not reached: raspberry-pi-5 / nanovlm-222m / lora / eager: 1 of 1 runs did not reach loss=2.5 " \
           "within their cap of 8 steps" in said
    wide = in_terminal(report_command, ["--store", str(evaluated_store), "--device", "raspberry-pi-5", "--study"],
                       width=220)
    assert "time to target" in wide and "energy to target" in wide and "0.54x [0.53-0.56] est" in wide


def test_html_draws_heldout_curves_against_seconds_and_joules_and_the_frontier_against_time_to_target(
        evaluated_store, tmp_path):
    from edgebench.report.build import collect
    from edgebench.report.html import render_html

    with Store(evaluated_store, read_only=True) as store:
        report = collect(store, baseline="sgd", interactive=True)
    figures = {f.name: f for f in report.figures}
    assert [n for n in figures if n.startswith("learning_")] == ["learning_raspberry-pi-5_nanovlm-222m"]
    (seconds_title, seconds), (joules_title, joules) = figures["learning_raspberry-pi-5_nanovlm-222m"].charts
    assert "training time (s)" in seconds_title and "energy (J, ESTIMATED)" in joules_title
    sgd_loss = next(t for t in seconds["data"] if t["name"].startswith("sgd") and t["yaxis"] == "y")
    def rounded(values):
        return [v if v is None else round(v, 6) for v in values]

    assert rounded(sgd_loss["x"]) == [0, 3.6, 7.2, None, 0, 3.78, 7.56]  # seconds of its steps: each run a line
    assert rounded(sgd_loss["y"]) == [4.0, 3.1, 2.4, None, 4.0, 3.1, 2.4]
    sgd_accuracy = next(t for t in seconds["data"] if t["name"].startswith("sgd") and t["yaxis"] == "y2")
    assert sgd_accuracy["y"][:3] == pytest.approx([0, 30, 60])  # % of the 10 samples each evaluation read
    sgd_joules = next(t for t in joules["data"] if t["name"].startswith("sgd") and t["yaxis"] == "y")
    assert sgd_joules["x"][:3] == pytest.approx([0, 18, 36], rel=0.01)  # 5 W for 0.9 s steps
    assert "(estimated)" in sgd_joules["hovertext"][1] and "run: 20261206-0800-sgd-0" in sgd_joules["hovertext"][1]
    assert [s["y0"] for s in seconds["layout"]["shapes"]] == [2.5]  # the target, dashed
    pareto = figures["pareto_raspberry-pi-5_nanovlm-222m"]
    assert pareto.title.endswith("peak memory vs time to the target (loss=2.5)")
    chart = pareto.charts[0][1]
    assert chart["layout"]["yaxis"]["title"]["text"] == "time to the target (loss=2.5), median (s)"
    assert sorted(y for t in chart["data"] if t["name"].startswith(("sgd", "adamw")) for y in t["y"]) == \
        pytest.approx([4.0, 7.38])
    assert figures["pareto_pixel-8-termux_nanovlm-222m"].title.endswith("peak memory vs time per step")
    page = unescape(render_html(report))
    assert "held-out loss" in page and "s to target" in page and "J to target (est.)" in page
    assert "lora / eager: 1 of 1 runs did not reach loss=2.5 within their cap of 8 steps" in page
    assert "sgd / eager (steps 10, no target)" in page  # the other devices' runs are named apart


# ---- what the study's notes and the HTML's run ids say ------------------------------------------
@pytest.fixture(scope="module")
def ended_store(tmp_path_factory):
    """One device's runs with the target loss=1.0 and a cap of 8 steps: sgd reaches it, lora runs
    to its cap without, mezo is interrupted at step 2 and adamw killed by the OOM killer at step 1
    (neither finished: no baseline for --baseline adamw)."""
    from results_fixtures import evaluated

    root = tmp_path_factory.mktemp("ended")
    with Store(root / "edgebench.duckdb") as store:
        for i, (method, losses, status, steps) in enumerate([("sgd", {0: 5.0, 4: 1.0}, "ok", 8),
                                                             ("lora", {0: 5.0, 8: 3.0}, "ok", 8),
                                                             ("mezo", {0: 5.0}, "interrupted", 3),
                                                             ("adamw", {0: 5.0}, "oom", 2)]):
            run = FakeRun(run_id=f"20261206-0800{i:02d}-pi-tiny-{method}-eager-a{i}f3", method=method, steps=steps,
                          status=status)
            run_dir = evaluated(run, root / "src", losses, "loss=1.0")
            meta = json.loads((run_dir / "meta.json").read_text())
            meta["spec"]["steps"] = 8  # each run's cap, whether it got there or not
            (run_dir / "meta.json").write_text(json.dumps(meta))
            store.ingest_run(run_dir, device="pi")
    return root / "edgebench.duckdb"


def test_runs_that_ended_early_are_not_said_to_have_run_to_their_cap(ended_store):
    """`did not reach ... within their cap of 8 steps` only for runs that ran to it; one interrupted
    at step 2 (or killed at step 1) says so (main said it of every run short of the target)."""
    from edgebench.report.build import collect
    from edgebench.report.study import unreached_notes

    with Store(ended_store, read_only=True) as store:
        notes = unreached_notes(collect(store, baseline="sgd").study)
    by = {note.split(" / ")[2]: note for note in notes}
    assert set(by) == {"lora", "mezo", "adamw"}  # sgd reached it
    assert by["lora"].endswith("1 of 1 runs did not reach loss=1.0 within their cap of 8 steps")
    assert by["mezo"].endswith("1 of 1 runs ended early, before reaching loss=1.0 (interrupted at step 2; "
                               "their cap: 8 steps)")
    assert "oom at step 1" in by["adamw"] and "within their cap" not in by["adamw"] + by["mezo"]
    mixed = {"device": "pi", "model": "tiny", "method": "m", "backend": "eager", "target": "loss=1.0", "steps": 80,
             "n": 3, "reached": 1, "ended_early": ["interrupted at step 16"]}
    assert unreached_notes([mixed]) == ["pi / tiny / m / eager: 2 of 3 runs did not reach loss=1.0: 1 within the cap "
                                        "of 80 steps, 1 ended early (interrupted at step 16)"]
    study = " ".join(in_terminal(report_command, ["--store", str(ended_store), "--study"], width=120).split())
    assert "(interrupted at step 2; their cap: 8 steps)" in study


def test_the_baseline_hint_names_only_methods_that_finished(ended_store, tmp_path):
    """No finished baseline: the --baseline it suggests are methods with a finished run there (not
    the baseline itself, not one that only ended early); where none finished, how to get one."""
    from edgebench.report.build import collect
    from edgebench.results.study import _no_baseline_note

    with Store(ended_store, read_only=True) as store:
        (note,) = collect(store, baseline="adamw").study_notes
    assert note == ("pi / tiny / eager: no finished adamw run to compare against (its runs: 1 oom); run it, or pass "
                    "--baseline with a method that finished here: lora, sgd")
    with Store(ended_store, read_only=True) as store:
        (note,) = collect(store, baseline="galore").study_notes
    assert note.endswith("no finished galore run to compare against; run it, or pass --baseline with a method that "
                         "finished here: lora, sgd")
    groups = [{"method": m, "status": s, "statuses": {s: 1}} for m, s in (("sgd", "oom"), ("mezo", "interrupted"))]
    none = _no_baseline_note("pi / tiny / eager", "sgd", groups)
    assert none.startswith("pi / tiny / eager: no finished run (1 interrupted, 1 oom): nothing to compare; a run "
                           "that ends ok comes first (`edgebench bench --methods sgd` on this host")
    assert "--baseline" not in none


def test_html_runs_table_tells_run_ids_apart(ended_store, tmp_path):
    """The runs table shows each id's tail that tells it apart (main showed its first 8 characters:
    the date, the same for every run of a sweep), the whole id on hover."""
    from edgebench.report.html import run_id_tails

    page = tmp_path / "r.html"
    _invoke("--store", str(ended_store), "--format", "html", "--out", str(page))
    shown = dict(re.findall(r'class="text id" title="([^"]+)">([^<]+)</td>', unescape(page.read_text())))
    assert len(shown) == 4 and len(set(shown.values())) == 4, shown
    assert shown["20261206-080001-pi-tiny-lora-eager-a1f3"] == "…a1f3"
    assert not any(tail.startswith("…20261206") or tail == "20261206…" for tail in shown.values())
    assert run_id_tails(["20261206-0800-sgd-0", "20261206-0800-sgd-1", "20261206-0801-adamw-0"]) == {
        "20261206-0800-sgd-0": "…sgd-0", "20261206-0800-sgd-1": "…sgd-1", "20261206-0801-adamw-0": "…adamw-0"}
    assert run_id_tails(["r0", "r1"]) == {"r0": "r0", "r1": "r1"}  # nothing shorter tells them apart
