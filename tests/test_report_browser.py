"""The HTML report in a real browser (headless Chromium): every chart drawn, no script error,
nothing fetched from the network, and at a phone's width no table wider than the page."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgebench.report.commands import report_command
from report_demo import DEVICES, EVALUATED, browse, demo_store


@pytest.fixture(scope="module")
def study_page(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    page = root / "study.html"
    done = CliRunner().invoke(report_command, ["--store", str(demo_store(root)), "--study", "--format", "html",
                                               "--out", str(page)], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return page


@pytest.mark.parametrize("width", [1400, 390])
def test_every_chart_draws_without_an_error_and_the_page_fits(study_page, width):
    page = browse(study_page, width, 1000)  # a page that never draws fails at browse's timeout
    assert page.problems == []  # no uncaught error, no console message, nothing fetched
    summary = page.summary
    assert summary["errors"] == ""  # what the page's own error handler caught
    charts = summary["charts"]
    runs = sum(repeats for methods in (*DEVICES.values(), *EVALUATED.values()) for *_, repeats in methods)
    # a frontier per device (in the study), 3 comparisons, per run its memory and (measured or temperature) power,
    # the evaluated device's held-out curves against seconds and joules
    assert len(charts) == len(DEVICES) + len(EVALUATED) + 3 + 2 * runs + 2 == int(summary["checks"]["charts"])
    assert {"learning_raspberry-pi-5_nanovlm-222m-0", "learning_raspberry-pi-5_nanovlm-222m-1"} <= set(charts)
    assert all(layers >= 2 for layers in charts.values()), charts  # plotly's SVG layers: each chart drawn
    assert summary["width"] == width
    assert summary["pageWidth"] <= width and summary["bodyWidth"] <= width  # nothing widens the page
    assert summary["tables"] == 0 and summary["boxes"] == 0  # a wide table scrolls inside its own box
