"""The HTML report's screenshots in docs/report.md: a study of three devices (the browser
test's store, tests/report_demo.py) drawn by headless Chromium at 1,400 px and at a phone's
390 px, each 2,200 px tall.

    .venv/bin/python scripts/report_screenshots.py [--out docs]
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from edgebench.report.commands import report_command  # noqa: E402
from report_demo import browse, demo_store  # noqa: E402

SHOTS = {"report-desktop.png": 1400, "report-phone.png": 390}
HEIGHT = 2200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    out = parser.parse_args().out
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "study.html"
        done = CliRunner().invoke(report_command, ["--store", str(demo_store(Path(tmp))), "--study",
                                                   "--format", "html", "--out", str(page)])
        assert done.exit_code == 0, done.output
        for name, width in SHOTS.items():
            shot = browse(page, width, HEIGHT, screenshot=True)
            assert not shot.problems and not shot.summary["errors"], (shot.problems, shot.summary["errors"])
            assert shot.png is not None
            with Image.open(io.BytesIO(shot.png)) as img:  # 256 colours: a fraction of the bytes, text still sharp
                img.convert("RGB").quantize(256).save(out / name, optimize=True)
            print(f"wrote {out / name} ({(out / name).stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
