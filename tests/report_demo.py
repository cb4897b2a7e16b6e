"""A study of three devices for the HTML report's browser test and its screenshots
(scripts/report_screenshots.py): a board with a power sensor that throttles, a phone with
only a power model, several methods with repeats, a run that ran out of memory, run ids as
long as real ones, and a board whose runs evaluated on held-out data with a target. Also
how both load a page in headless Chromium (`browse`)."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgebench.results.store import Store
from results_fixtures import FakeRun, evaluated, store_of

DEVICES = {  # device -> [(method, rss MiB, step s, status, repeats)]
    "jetson-orin-nano": [("sgd", 240, 0.30, "ok", 2), ("adamw", 330, 0.34, "ok", 2), ("lora", 210, 0.26, "ok", 1),
                         ("mezo", 180, 0.55, "oom", 1)],
    "pixel-8-termux": [("sgd", 260, 0.42, "ok", 2), ("adamw", 350, 0.47, "ok", 1), ("lora", 225, 0.36, "ok", 1)],
}


# A board with only a power model whose runs evaluated on held-out data with a target: its
# frontier is peak memory against time to the target, and lora never reaches it within its cap.
EVALUATED = {"raspberry-pi-5": [("sgd", 250, 0.9, {0: 4.0, 4: 3.1, 8: 2.4}, 2),
                                ("adamw", 340, 1.0, {0: 4.0, 4: 2.3}, 1),
                                ("lora", 215, 0.7, {0: 4.0, 4: 3.6, 8: 3.3}, 1)]}
TARGET = "loss=2.5"


def demo_store(root: Path) -> Path:
    """The study's store at root/edgebench.duckdb."""
    path = store_of(root, _runs())
    with Store(path) as store:
        for device, methods in EVALUATED.items():
            for i, (method, rss, step_s, losses, repeats) in enumerate(methods):
                for r in range(repeats):
                    run = FakeRun(run_id=f"20261206-080{i}-{method}-{r}d41e5b2", model="nanovlm-222m", method=method,
                                  rss_base=(rss + 4 * r) << 20, step_s=step_s * (1 + 0.05 * r), steps=8, power=None,
                                  power_est=lambda t: 5.0 + 0 * t)
                    correct = {after: min(10, 3 * k) for k, after in enumerate(losses)}
                    store.ingest_run(evaluated(run, root / "src" / device, losses, TARGET, correct), device=device)
    return path


def _runs() -> dict[str, list[FakeRun]]:
    """DEVICES' runs, by device."""
    runs = {}
    for d, (device, methods) in enumerate(DEVICES.items()):
        runs[device] = [
            FakeRun(run_id=f"20261206-07{d}{i}-{method}-{r}f3c9a7e", model="nanovlm-222m", method=method,
                    rss_base=(rss + 6 * r) << 20, step_s=step_s * (1 + 0.08 * r), status=status,
                    power=(lambda t: 6.0 + 0.4 * t) if d == 0 else None,
                    power_est=None if d == 0 else (lambda t: 4.5 + 0 * t), throttle_after_s=2.0 if d == 0 else None,
                    loss_rate=0.9 if method != "mezo" else 0.99)
            for i, (method, rss, step_s, status, repeats) in enumerate(methods) for r in range(repeats)]
    return runs


def chromium() -> str:
    """The browser's path; a clear failure where it is missing (scripts/setup.sh installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is missing: `apt-get install chromium` (scripts/setup.sh installs it as root)"
    return found


# What the page says once it has loaded and every chart is drawn (html.py's script fills #report-checks): each chart
# div's count of plotly's SVG layers, the page's and the window's width, any table wider than the
# window that is not inside a box of its own that scrolls, and any error the page caught.
SUMMARY = """(() => {
  const checks = document.getElementById('report-checks'), width = document.documentElement.clientWidth;
  if (document.readyState !== 'complete' || !checks || !checks.dataset.charts) return null;
  return {checks: {...checks.dataset}, errors: document.getElementById('report-errors').textContent,
          charts: Object.fromEntries([...document.querySelectorAll('div.chart')].map(
              d => [d.dataset.chart, d.querySelectorAll('svg.main-svg').length])),
          tables: [...document.querySelectorAll('table')].filter(
              t => t.parentElement.className !== 'wide' && t.getBoundingClientRect().right > width).length,
          boxes: [...document.querySelectorAll('.wide')].filter(b => b.getBoundingClientRect().right > width).length,
          bodyWidth: document.body.scrollWidth, pageWidth: document.documentElement.scrollWidth, width};
})()"""


@dataclass
class Page:
    summary: dict[str, Any]  # SUMMARY's answer
    problems: list[str]  # exceptions, console messages, log entries, requests other than file: and data:
    png: bytes | None  # the screenshot, when asked


def browse(page: Path, width: int, height: int, screenshot: bool = False, timeout: float = 90) -> Page:
    """`page` in headless Chromium with a viewport of exactly width x height (the window itself
    cannot be narrower than 500 px: the DevTools protocol, over a pipe, sets the viewport),
    once its charts are drawn."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    with tempfile.TemporaryDirectory() as profile:
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"]
        proc = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{to_r} 4>&{from_w}', chromium(), *args],
                                pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        try:
            return _Session(to_w, from_r, time.monotonic() + timeout).load(page, width, height, screenshot)
        finally:
            os.close(to_w)
            proc.wait(timeout=10)
            os.close(from_r)


class _Session:
    """The DevTools protocol over Chromium's pipe: JSON messages, each ended by a NUL byte."""

    def __init__(self, out: int, inp: int, deadline: float) -> None:
        self.out, self.inp, self.deadline = out, inp, deadline
        self.buffer, self.ids, self.session = b"", 0, None
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.ids += 1
        message = {"id": self.ids, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self.session
        os.write(self.out, json.dumps(message).encode() + b"\0")
        while True:
            got = self._next()
            if got.get("id") == self.ids:
                assert "error" not in got, f"{method}: {got['error']}"
                return got.get("result", {})
            self.events.append(got)

    def _next(self) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = self.deadline - time.monotonic()
            assert left > 0 and select.select([self.inp], [], [], left)[0], "Chromium did not answer in time"
            chunk = os.read(self.inp, 1 << 20)
            assert chunk, "Chromium closed its pipe"
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def load(self, page: Path, width: int, height: int, screenshot: bool) -> Page:
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        self.send("Page.navigate", url=page.resolve().as_uri())
        while (summary := self.send("Runtime.evaluate", expression=SUMMARY, returnByValue=True)["result"]
               .get("value")) is None:
            assert time.monotonic() < self.deadline, "the page's charts were not drawn in time"
            time.sleep(0.2)
        png = None
        if screenshot:
            shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=False)
            png = base64.b64decode(shot["data"])
        self.send("Browser.close")
        return Page(summary, _problems(self.events), png)


def _problems(events: list[dict[str, Any]]) -> list[str]:
    """What went wrong on the page, from the protocol's events."""
    out = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            out.append(f"uncaught: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Runtime.consoleAPICalled":
            out.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                for a in params["args"]))
        elif method == "Log.entryAdded":
            out.append(f"log {params['entry']['level']}: {params['entry']['text']}")
        elif method == "Network.requestWillBeSent" and not params["request"]["url"].startswith(("file:", "data:")):
            out.append(f"fetched {params['request']['url']}")
    return out
