"""edgebench downloads nothing while it runs: bitsandbytes' import-time Hub fetch runs offline."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading

IMPORT_BITSANDBYTES = """
import edgebench, bitsandbytes
from huggingface_hub import constants
print("offline after import:", constants.HF_HUB_OFFLINE)
"""


class RecordingHub(http.server.BaseHTTPRequestHandler):
    """A local stand-in endpoint for the Hub that records every request and answers 404."""

    requests: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.requests.append(self.path)
        self.send_error(404)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_importing_bitsandbytes_under_edgebench_asks_the_hub_nothing_and_warns_nothing():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RecordingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        done = subprocess.run([sys.executable, "-c", IMPORT_BITSANDBYTES], env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    assert RecordingHub.requests == []
    assert "offline after import: False" in done.stdout  # the user's own Hub setting is back
    assert "gemm_4bit_forward" not in done.stderr and "trust check" not in done.stderr, done.stderr
