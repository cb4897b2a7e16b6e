"""Reports: terminal tables, PNG figures, one offline HTML file, CSV/JSON that match the store."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner
from PIL import Image

from edgebench.report import plots
from edgebench.report.commands import report_command
from edgebench.results.store import Store
from results_fixtures import FakeRun

RUNS = {  # device -> [(run_id, method, rss MiB, step s, status, power measured?)]
    "pi": [("a", "adamw", 300, 0.2, "ok", True), ("b", "sgd", 200, 0.3, "ok", True), ("c", "mezo", 350, 0.4, "oom", True)],
    "phone": [("a", "adamw", 320, 0.25, "ok", False), ("d", "lora", 220, 0.35, "ok", False)],
}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    path = root / "edgebench.duckdb"
    with Store(path) as store:
        for device, runs in RUNS.items():
            for run_id, method, rss, step_s, status, measured in runs:
                run = FakeRun(run_id=run_id, method=method, rss_base=rss << 20, step_s=step_s, status=status,
                              power=(lambda t: 3.0 + 0.1 * t) if measured else None,
                              power_est=None if measured else (lambda t: 4.0 + 0 * t), throttle_after_s=1.5)
                store.ingest_run(run.write(root / "src" / device), device=device)
    return path


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


def test_html_is_one_offline_file_with_every_run(store_path, tmp_path):
    out = tmp_path / "report.html"
    _invoke("--store", str(store_path), "--format", "html", "--out", str(out))
    html = out.read_text()
    for device, runs in RUNS.items():
        for run_id, *_ in runs:
            assert f'id="run-{device}-{run_id}"' in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    parser = _Refs()
    parser.feed(html)
    assert "script" not in parser.tags and "link" not in parser.tags
    assert parser.refs and all(r.startswith("data:image/png;base64,") for r in parser.refs)
    for ref in parser.refs:
        Image.open(io.BytesIO(base64.b64decode(ref.split(",", 1)[1]))).verify()
    assert "J/step (est.)" in html and "ESTIMATED" in html


def _store_truth(store_path):
    with Store(store_path, read_only=True) as store:
        q = store.con.execute
        runs = {(d, r): s for d, r, s in q("SELECT device, run_id, status FROM runs").fetchall()}
        median = dict(((d, r), m) for d, r, m in q("""SELECT device, run_id, median(duration_s) FROM steps
            WHERE phase = 'measure' GROUP BY ALL""").fetchall())
        rss = dict(((d, r), m) for d, r, m in q("SELECT device, run_id, max(rss_bytes) FROM samples GROUP BY ALL").fetchall())
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
    assert "lora" in text and "mezo" not in text and "est." in text
    assert "Clock alignment" in text  # no probes in this store: the report says the clock is the device's own
    assert plots._energy_colour([{"energy_per_step_j": None, "energy_per_step_j_est": 1.0}])[1].endswith("ESTIMATED)")


def test_report_on_a_missing_store_says_what_to_do(tmp_path):
    result = CliRunner().invoke(report_command, ["--store", str(tmp_path / "none.duckdb")])
    assert result.exit_code != 0 and "edgebench ingest" in result.output
