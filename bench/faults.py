"""A campaign of bad inputs and faults against the real CLI, runner and collect; prints
how many ended badly. Every count should be zero.

    .venv/bin/python bench/faults.py            # 121 cases, 3-6 minutes on 2 cores (needs root, sshd)
    .venv/bin/python bench/faults.py --quick    # a few cases of each kind (tests/test_faults_bench.py)

Counts: tracebacks shown to the user, internal errors (edgebench's catch-all for a bug),
exit code 0 for an error, commands that hung (killed after their time), cases that met the
campaign's memory limit, run directories without result.json, corrupted run directories
(unparsable result.json, garbage lines inside a trace), files read outside what a command
was given (the image that hostile datasets point at: its access time moves when read),
files written outside the runs folder (anywhere else in the campaign's workspace, or at the
paths the hostile device and names aim at), terminal control sequences a device got onto the
screen (ESC or BEL in any output: the output is piped, so edgebench's own styles are off),
and runs without a final status (a killed sweep or `lab down`: status, collect and the store
must agree on one). Every command runs in the campaign's memory cgroup (MEMORY_LIMIT), so one
that reads without end is killed there instead of taking the host's memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgebench.devices.cgroups import CgroupError, Limits  # noqa: E402
from edgebench.runner.spec import RunSpec  # noqa: E402
from edgebench.telemetry.trace import read_trace  # noqa: E402

PY = sys.executable
ESCAPES = [
    Path("/tmp/edgebench-faults-escape"),
    Path("/tmp/edgebench-faults-abs"),
    Path("/tmp/edgebench-faults-evildev"),
    Path("/tmp/edgebench-faults-meta"),
]
HOSTILE_TEXT = "sgd\x1b]0;pwned\x07\x1b[2J"  # sets the terminal's title, clears the screen
# Every process the campaign starts, together: a lab device (1 GiB), two collects and a sweep fit well inside
MEMORY_LIMIT = 3 << 30
# --quick: the cases kept of each kind (bad input, hostile devices, signals, sweeps and the lab)
QUICK = {
    "bench unknown method", "bench nan duration", "predict profile alias bomb", "models load garbage",
    "bench checkpoint truncated", "bench data image ..", "bench data image symlink out",
    "bench data hf image path absolute", "ingest meta run_id ..", "report foreign duckdb", "deploy path device name",
    "collect hostile listing: run id ..", "collect hostile listing: absolute file name", "collect non-JSON listing",
    "collect meta run_id ..", "status with escape sequences", "report --format html with escape sequences",
    "bench Ctrl-C once", "bench kill -9 worker",
    "sweep on a full disk", "deploy while a sweep runs there", "sweep SIGTERM", "collect after a killed sweep",
    "lab up", "deploy to the lab", "lab down mid-sweep", "lab down --purge after lab down",
    "ingest a sample with text for a number", "ingest another store naming a relative path",
}


def tiny(**kw) -> RunSpec:
    base = dict(model="tiny", method="sgd", batch_size=1, text_length=16, warmup_steps=0, steps=2)
    return RunSpec(**{**base, **kw})


class Campaign:
    def __init__(self, work: Path, quick: bool = False):
        self.work = work
        self.quick = quick
        self.limits = Limits.create(f"edgebench-faults/{work.name}", MEMORY_LIMIT, os.cpu_count() or 1)
        self.home = work / "home"  # the user's current directory; runs/ inside it
        self.home.mkdir()
        # the user's store is per user (edgebench.results.default_store): the campaign's is in runs/, never theirs
        self.env = {**os.environ, "EDGEBENCH_INVENTORY": str(work / "inventory.yaml"),
                    "EDGEBENCH_LAB_DIR": str(work / "lab"),
                    "EDGEBENCH_STORE": str(self.home / "runs" / "edgebench.duckdb")}
        self.rows: list[dict] = []
        self.extra_dirs: list[Path] = []  # run dirs on a tmpfs, checked before it is unmounted
        self.last = time.monotonic()  # when the last case ended: each case's seconds

    def wanted(self, case: str) -> bool:
        return not self.quick or case in QUICK

    def enter(self) -> None:
        """In each child before it runs: into the campaign's memory cgroup, and a session of its own with
        SIGINT at its default, as a terminal's foreground job (a signal or a kill reaches its whole group)."""
        for procs in self.limits.procs_files():
            procs.write_text(str(os.getpid()))
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    def check_dirs(self, root: Path) -> None:
        self.extra_dirs.extend(d for d in run_dirs(root) if not (d / "result.json").exists() or corrupted(d))

    def record(self, name: str, rc: int | None, output: str, error_expected: bool = True) -> None:
        """A case's outcome; `rc` None: it hung."""
        now = time.monotonic()
        self.rows.append({"case": name, "rc": rc, "s": now - self.last, "hang": rc is None,
                          "traceback": "Traceback (most recent call last)" in output,
                          "internal_error": "internal error" in output, "exit0_on_error": error_expected and rc == 0,
                          "escapes": "\x1b" in output or "\x07" in output or "\x9b" in output})
        self.last = now

    def cli(self, name: str, *args: str, timeout: float = 120, error_expected: bool = True) -> None:
        if self.wanted(name):
            rc, out, err = self.run([PY, "-m", "edgebench.cli", *args], timeout)
            self.record(name, rc, out + err, error_expected)

    def start(self, argv: list[str], env: dict | None = None, merged: bool = True) -> subprocess.Popen:
        """`argv` started in the campaign's cgroup and a session of its own, in `home`."""
        return subprocess.Popen(argv, cwd=self.home, env=env or self.env, preexec_fn=self.enter, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merged else subprocess.PIPE)

    def run(self, argv: list[str], timeout: float = 120, env: dict | None = None) -> tuple[int | None, str, str]:
        return finish(self.start(argv, env, merged=False), timeout)

    def inventory(self, devices: dict) -> None:
        (self.work / "inventory.yaml").write_text(yaml.safe_dump({"devices": devices}))


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of a started command; exit code None where it hung past `timeout`
    (its process group is then killed)."""
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err or ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err or ""


def wait_for(predicate, timeout_s: float = 120) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def stepping(pattern_root: Path) -> bool:
    for events in pattern_root.rglob("events.jsonl"):
        if any(e.get("event") == "step_end" for e in read_trace(events).records):
            return True
    return False


def user_errors(c: Campaign) -> None:
    """Bad input: each must be one line, exit 2 (or 1), no traceback, nothing started."""
    for name, *args in c.cases:
        c.cli(name, *args)


def prepare_user_errors(c: Campaign) -> None:
    """The damaged files and devices the bad inputs name (made before the write check starts)."""
    bad_profile = c.work / "broken.yaml"
    bad_profile.write_text((ROOT / "device_profiles" / "raspberry-pi-4-4gb.yaml").read_text() + "\nram_bytes: [\n")
    bomb = c.work / "bomb.yaml"  # ten lines that stand for 9**9 values
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")))
    (c.work / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    for name, field in (("steps", {"steps": 1e20}), ("threads", {"threads": 100000})):
        (c.work / f"spec-{name}.json").write_text(json.dumps({"model": "tiny", "method": "sgd", **field}))
    from edgebench.model.config import get_config

    config = get_config("tiny").to_nanovlm_dict()  # whole and valid: each case breaks one thing
    ckpts = {}
    for kind, data, changes in (
        ("truncated", b'\x10\x00\x00\x00\x00\x00\x00\x00{"a":', {}),
        ("empty", b"", {}),
        ("garbage", os.urandom(512), {}),
        ("no-weights", None, {}),
        ("missing-key", b"", {"vit_hidden_dim": None}),
        ("negative-blocks", b"", {"lm_n_blocks": -3}),
        ("nan-eps", b"", {"lm_rms_eps": float("nan")}),
        ("empty-config", b"", None),
    ):
        d = c.work / f"ckpt-{kind}"
        d.mkdir()
        written = {} if changes is None else {k: v for k, v in {**config, **changes}.items() if v is not None}
        (d / "config.json").write_text(json.dumps(written))
        if data is not None:
            (d / "model.safetensors").write_bytes(data)
        ckpts[kind] = d
    data = _hostile_datasets(c)
    for name, run_id in (("r-run", "r-run"), ("hostile-run", "../../../../" + str(ESCAPES[3]).lstrip("/"))):
        (c.work / name).mkdir()  # run directories; the second's meta.json names a path as its run_id
        (c.work / name / "meta.json").write_text(json.dumps({"run_id": run_id, "spec": tiny().to_dict()}))
    run = c.work / "hostile-run"
    (c.work / "meter.csv").write_text("time,watts\n1,2.5\n2,abc\n")
    import sqlite3

    sqlite = sqlite3.connect(c.work / "other.sqlite")
    sqlite.execute("CREATE TABLE t (a INT)")
    sqlite.commit()
    sqlite.close()
    (c.work / "spec-unknown-model.json").write_text(json.dumps({"model": "tinyy", "method": "sgd"}))
    (c.work / "spec-nan-lr.json").write_text(json.dumps({"model": "tiny", "method": "sgd", "lr": float("nan")}))
    import duckdb

    foreign = c.work / "foreign.duckdb"
    duckdb.connect(str(foreign)).execute("CREATE TABLE t (a INT)").close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    c.inventory({"away": {"profile": "raspberry-pi-4-4gb", "host": "127.0.0.1", "port": closed_port, "user": "pi",
                          "connect_timeout_s": 2},
                 "../../escape": {"profile": "local", "kind": "local"},
                 "/abs-name": {"profile": "local", "kind": "local"}})
    cases = [
        ("bench unknown method", "bench", "--methods", "adamww"),
        ("bench duplicate knob", "bench", "--methods", "sgd+sgd"),
        ("bench conflicting knobs", "bench", "--methods", "sgd+adamw"),
        ("bench duplicate lora", "bench", "--methods", "lora+lora"),
        ("bench empty method list", "bench", "--methods", ","),
        ("bench empty method part", "bench", "--methods", "sgd+"),
        ("bench unknown model", "bench", "--model", "tinyy"),
        ("bench model path missing", "bench", "--model", "/nonexistent/ckpt"),
        ("bench negative duration", "bench", "--duration", "-5s"),
        ("bench zero duration", "bench", "--duration", "0"),
        ("bench infinite duration", "bench", "--duration", "1e999"),
        ("bench nan duration", "bench", "--duration", "nan"),
        ("bench word duration", "bench", "--duration", "soon"),
        ("bench zero steps", "bench", "--steps", "0"),
        ("bench zero batch", "bench", "--batch-size", "0"),
        ("bench unknown backend", "bench", "--backend", "tensorrt"),
        ("bench sample rate 0", "bench", "--sample-hz", "0"),
        ("bench negative timeout", "bench", "--timeout", "-1"),
        ("bench remote device", "bench", "--device", "nosuch"),
        ("predict unknown profile", "predict", "--method", "adamw", "--device", "nosuch"),
        ("predict profile not yaml", "predict", "--method", "adamw", "--device", "/etc/hostname"),
        ("predict profile missing", "predict", "--method", "adamw", "--device", "/nonexistent.yaml"),
        ("predict profile broken", "predict", "--method", "adamw", "--device", str(bad_profile)),
        ("predict profile alias bomb", "predict", "--method", "adamw", "--device", str(bomb)),
        ("predict profile binary", "predict", "--method", "adamw", "--device", str(c.work / "binary.yaml")),
        ("bench threads 100000", "bench", "--threads", "100000"),
        ("bench accum2000000000", "bench", "--methods", "sgd+accum2000000000"),
        ("deploy spec steps 1e20", "deploy", "--device", "local", "--spec", str(c.work / "spec-steps.json")),
        ("deploy spec threads 100000", "deploy", "--device", "local", "--spec", str(c.work / "spec-threads.json")),
        ("predict unknown method", "predict", "--method", "adamww", "--device", "raspberry-pi-4-4gb"),
        ("predict unknown model", "predict", "--method", "adamw", "--model", "tinyy", "--ram-bytes", "1000"),
        ("models load missing", "models", "--load", "/nonexistent/ckpt"),
        ("models load truncated", "models", "--load", str(ckpts["truncated"])),
        ("models load empty", "models", "--load", str(ckpts["empty"])),
        ("models load garbage", "models", "--load", str(ckpts["garbage"])),
        *[
            (f"bench checkpoint {kind}", "bench", "--model", str(path), "--methods", "sgd")
            for kind, path in ckpts.items()
        ],
        *[
            (f"models load {kind}", "models", "--load", str(ckpts[kind]))
            for kind in ("no-weights", "missing-key", "negative-blocks", "nan-eps", "empty-config")
        ],
        ("bench lr inf", "bench", "--lr", "inf"),
        ("bench lr nan", "bench", "--lr", "nan"),
        ("bench timeout nan", "bench", "--timeout", "nan"),
        ("bench text length 1e8", "bench", "--text-length", "100000000"),
        ("bench batch 1e8 (memory preflight)", "bench", "--batch-size", "100000000"),
        (
            "bench 222m adamw batch 64 (memory preflight)",
            "bench",
            "--model",
            "nanovlm-222m",
            "--methods",
            "adamw",
            "--batch-size",
            "64",
        ),
        *[(f"bench data {label}", "bench", "--data", str(path), "--methods", "sgd") for label, path in data.items()],
        ("bench save /proc/self", "bench", "--methods", "sgd", "--save", "/proc/self"),
        ("bench every run ends timeout", "bench", "--methods", "sgd", "--timeout", "0.01", "--text-length", "16"),
        ("ingest device ..", "ingest", str(c.work / "r-run"), "--device", "../../../" + str(ESCAPES[2]).lstrip("/")),
        ("ingest device absolute", "ingest", str(c.work / "r-run"), "--device", str(ESCAPES[2])),
        ("ingest meta run_id ..", "ingest", str(run)),
        (
            "import-trace device ..",
            "import-trace",
            str(c.work / "meter.csv"),
            "--device",
            "../x",
            "--power-col",
            "watts",
        ),
        (
            "import-trace non-numeric",
            "import-trace",
            str(c.work / "meter.csv"),
            "--device",
            "pi",
            "--power-col",
            "watts",
        ),
        ("report sqlite store", "report", "--store", str(c.work / "other.sqlite")),
        ("deploy spec unknown model", "deploy", "--device", "local", "--spec", str(c.work / "spec-unknown-model.json")),
        ("deploy spec nan lr", "deploy", "--device", "local", "--spec", str(c.work / "spec-nan-lr.json")),
        ("devices add path name", "devices", "add", "../../evil", "--host", "203.0.113.1"),
        ("predict os memory all of it", "predict", "--method", "sgd", "--ram-bytes", "1000000000", "--os-memory",
         "1GB"),
        ("ingest into non-duckdb", "ingest", str(c.work), "--store", "/etc/hostname"),
        ("ingest missing dir", "ingest", "/nonexistent/run", "--store", "s.duckdb"),
        ("report non-duckdb", "report", "--store", "/etc/hostname"),
        ("report foreign duckdb", "report", "--store", str(foreign)),
        ("report missing store", "report", "--store", "/nonexistent/x.duckdb"),
        ("live unknown device", "live", "--device", "nosuch"),
        ("live missing dir", "live", "--dir", "/nonexistent/run"),
        ("status unknown device", "status", "--device", "nosuch"),
        ("status unreachable device", "status", "--device", "away"),
        ("collect unknown device", "collect", "--device", "nosuch"),
        ("collect unreachable device", "collect", "--device", "away"),
        ("deploy unknown device", "deploy", "--device", "nosuch", "--methods", "sgd"),
        ("deploy path device name", "deploy", "--device", "../../escape", "--methods", "sgd"),
        ("deploy absolute device name", "deploy", "--device", "/abs-name", "--methods", "sgd"),
        ("deploy unreachable device", "deploy", "--device", "away", "--methods", "sgd"),
        ("deploy unknown method", "deploy", "--device", "away", "--methods", "adamww"),
        ("unknown command", "benchh"),
        ("unknown option", "bench", "--stepz", "3"),
    ]
    c.cases = cases


def _hostile_datasets(c: Campaign) -> dict[str, Path]:
    """Folder datasets, each with one bad second line: an image outside the folder (.., absolute,
    a symlink), a text file named .jpg, a 20000x20000 PNG (a few KiB on disk), a truncated JPEG; Hugging Face
    datasets whose image path leads outside (.., absolute)."""
    from PIL import Image
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    Image.new("RGB", (8, 8)).save(c.work / "outside.png")
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        ["what colour red"], trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<eos>"])
    )
    out = {}
    for label, image in (("image ..", "../outside.png"), ("image absolute", str(c.work / "outside.png")),
                         ("image symlink out", "link.png"), ("text file as .jpg", "text.jpg"),
                         ("20000x20000 png", "huge.png"), ("truncated jpeg", "cut.jpg")):
        folder = c.work / f"data-{label.split()[0]}-{label.split()[-1].strip('.')}"
        folder.mkdir()
        tokenizer.save(str(folder / "tokenizer.json"))
        Image.new("RGB", (8, 8)).save(folder / "a.png")
        os.symlink(c.work / "outside.png", folder / "link.png")
        (folder / "text.jpg").write_text("not an image\n")
        if label.startswith("20000"):
            Image.new("1", (20000, 20000)).save(folder / "huge.png")
        if label.startswith("truncated"):  # its header reads fine; its pixels end half-way
            Image.radial_gradient("L").convert("RGB").save(folder / "cut.jpg")
            (folder / "cut.jpg").write_bytes((folder / "cut.jpg").read_bytes()[:2000])
        lines = [{"image": "a.png", "question": "what colour", "answer": "red"},
                 {"image": image, "question": "what colour", "answer": "red"}]
        (folder / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        out[label] = folder
    import pyarrow as pa
    import pyarrow.parquet as pq

    for label, image in (("hf image path ..", "../outside.png"),
                         ("hf image path absolute", str(c.work / "outside.png"))):
        folder = c.work / f"data-hf-{label.split()[-1].strip('.') or 'dotdot'}"
        folder.mkdir()
        tokenizer.save(str(folder / "tokenizer.json"))  # a Hugging Face dataset whose image is {bytes: null, path}
        pq.write_table(pa.table({"images": [[{"bytes": None, "path": image}]],
                                 "texts": [[{"user": "what colour", "assistant": "red"}]]}), folder / "train.parquet")
        out[label] = folder
    return out


def hostile_listings(c: Campaign) -> None:
    sha = "0" * 64
    shapes = [("run id ..", "../../../../" + str(ESCAPES[0]).lstrip("/"), "f"),
              ("file name ..", "ok", "../../../../../../" + str(ESCAPES[0]).lstrip("/")),
              ("absolute file name", "ok", str(ESCAPES[1])),
              ("hidden run id", ".x", "f"),
              ("separator in run id", "a/b", "f")]
    for label, rid, fname in shapes:
        listing = {
            "root": str(c.work / "dev"),
            "sweeps": {"s1": {"state": None, "runs": {rid: {fname: {"size": 1, "sha256": sha}}}}},
        }
        fake = c.work / "fake-python"
        fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(listing)}\nEOF\n")
        fake.chmod(0o755)
        c.inventory(
            {"evil": {"profile": "local", "kind": "local", "python": str(fake), "workdir": str(c.work / "dev")}}
        )
        c.cli(f"collect hostile listing: {label}", "collect", "--device", "evil")
    listing = {"root": 5, "sweeps": []}
    (c.work / "fake-python").write_text(f"#!/bin/sh\necho '{json.dumps(listing)}'\n")
    c.cli("collect malformed listing", "collect", "--device", "evil")
    (c.work / "fake-python").write_text("#!/bin/sh\necho 'Welcome to the board!'\n")
    c.cli("collect non-JSON listing", "collect", "--device", "evil")
    hostile_runs(c)


def hostile_runs(c: Campaign) -> None:
    """A device whose runs' meta.json name a path as run_id, or hold escape sequences in names
    and details: collect refuses the first, and status, collect and report show the rest as text."""
    work = c.home / "runs" / "hostile-device"
    sweep = work / "sweeps" / "s1"
    for rid, meta_id in (("a", "../../../../" + str(ESCAPES[3]).lstrip("/")), ("b", "b")):
        run = sweep / "runs" / rid
        run.mkdir(parents=True)
        spec = tiny(run_id=meta_id, method=HOSTILE_TEXT).to_dict()
        (run / "meta.json").write_text(json.dumps({"run_id": meta_id, "spec": spec}))
        (run / "result.json").write_text(json.dumps({"run_id": meta_id, "status": "error", "method": HOSTILE_TEXT,
                                                      "detail": f"boom {HOSTILE_TEXT}"}))
    (sweep / "sweep.json").write_text(json.dumps({"state": "stopped", "why": HOSTILE_TEXT,
                                                  "runs": {"a": "error", "b": HOSTILE_TEXT}}))
    (sweep / "specs").mkdir()
    c.inventory({"hostile": {"profile": "local", "kind": "local", "workdir": str(work)}})
    c.cli("collect meta run_id ..", "collect", "--device", "hostile")
    c.cli("status with escape sequences", "status", "--device", "hostile", error_expected=False)
    c.cli("report with escape sequences", "report", error_expected=False)
    for fmt, out in (("png", "runs/figures"), ("html", "runs/report.html")):  # matplotlib's glyph warnings
        c.cli(f"report --format {fmt} with escape sequences", "report", "--format", fmt, "--out", out,
              error_expected=False)


def hostile_records(c: Campaign) -> None:
    """A run whose samples.jsonl holds text where a number belongs, and another store whose runs
    table names a relative path: `ingest` refuses each in one line (exit 2), storing nothing of it."""
    import duckdb

    sampled = [d for d in run_dirs(c.home / "runs") if (d / "samples.jsonl").exists()
               and (d / "samples.jsonl").stat().st_size and (d / "result.json").exists()]
    if not sampled:
        raise RuntimeError("no run with samples to damage: the sweeps above left none")
    where = c.home / "runs" / "hostile-records"
    run = where / sampled[0].name
    shutil.copytree(sampled[0], run)
    with open(run / "samples.jsonl", "a") as fh:
        fh.write(json.dumps({"t_ns": 2**40, "rss_bytes": "a lot"}) + "\n")
    c.cli("ingest a sample with text for a number", "ingest", str(run), "--store", str(where / "samples.duckdb"))
    other = where / "other.duckdb"
    shutil.copy2(c.env["EDGEBENCH_STORE"], other)
    with duckdb.connect(str(other)) as con:
        con.execute("UPDATE runs SET raw_dir = 'relative/x'")
    c.cli("ingest another store naming a relative path", "ingest", str(other), "--store", str(where / "mine.duckdb"))


def signals(c: Campaign) -> None:
    """Ctrl-C (once, twice), SIGTERM to bench; kill -9 of a worker and of a supervisor."""
    for label, sig, times in (("Ctrl-C once", signal.SIGINT, 1), ("Ctrl-C twice", signal.SIGINT, 2),
                              ("SIGTERM", signal.SIGTERM, 1)):
        if not c.wanted(f"bench {label}"):
            continue
        proc = stepping_bench(c, "sgd,adamw")
        for _ in range(times):
            os.killpg(proc.pid, sig)
            time.sleep(0.3)
        rc, out, _ = finish(proc, 120)
        c.record(f"bench {label}", rc, out)
    for label, target in (("kill -9 worker", "worker"), ("kill -9 supervisor", "supervisor")):
        if not c.wanted(f"bench {label}"):
            continue
        proc = stepping_bench(c, "sgd")
        supervisor = int(
            subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()[0]
        )
        worker = int(subprocess.run(["pgrep", "-P", str(supervisor)], capture_output=True, text=True).stdout.split()[0])
        os.kill(worker if target == "worker" else supervisor, signal.SIGKILL)
        rc, out, _ = finish(proc, 120)
        c.record(f"bench {label}", rc, out, error_expected=False)


def stepping_bench(c: Campaign, methods: str) -> subprocess.Popen:
    """A bench of long tiny runs, started and taking steps."""
    before = set((c.home / "runs").glob("*"))
    proc = c.start([PY, "-m", "edgebench.cli", "bench", "--methods", methods, "--steps", "100000",
                    "--text-length", "16"])
    wait_for(lambda: any(stepping(d) for d in set((c.home / "runs").glob("*")) - before if d.is_dir()))
    return proc


def sweeps(c: Campaign) -> None:
    """A killed sweep restarted; a sweep on a full disk; a sweep stopped by SIGTERM; two collects;
    a sweep killed with SIGKILL; `lab down` mid-sweep."""
    dev = c.home / "runs" / "device-work"  # device work dirs live inside runs/ too: all writes are there
    if c.wanted("sweep killed then resumed"):
        killed_then_resumed(c, dev / "sweeps" / "s1")
    if c.wanted("sweep on a full disk"):
        full_disk(c)
    proc, _ = stepping_sweep(c, dev / "sweeps" / "s3", "e")
    deploy_while_running(c, dev)
    os.kill(proc.pid, signal.SIGTERM)
    rc, out, _ = finish(proc, 60)
    c.record("sweep SIGTERM", rc, out)

    c.inventory({"box": {"profile": "local", "kind": "local", "workdir": str(dev)}})
    if c.wanted("concurrent collect 1"):
        procs = [c.start([PY, "-m", "edgebench.cli", "collect", "--device", "box"]) for _ in range(2)]
        for i, p in enumerate(procs):
            rc, out, _ = finish(p, 300)
            c.record(f"concurrent collect {i + 1}", rc, out, error_expected=False)
            c.rows[-1]["exit0_on_error"] = rc != 0  # a collect of good runs must succeed: count it as a failure
    if c.wanted("status of a stopped and an interrupted sweep"):
        c.cli("status of a stopped and an interrupted sweep", "status", "--device", "box")
        c.rows[-1]["exit0_on_error"] = False  # every device answered: exit 0 is right
    killed_sweep_agrees(c, dev)
    if c.wanted("lab down mid-sweep"):
        lab_down_mid_sweep(c)


def killed_then_resumed(c: Campaign, sweep: Path) -> None:
    """A sweep killed mid-run (SIGKILL to its group), then run again: it finishes what is left."""
    (sweep / "specs").mkdir(parents=True)
    tiny(run_id="a", steps=100_000).save(sweep / "specs" / "00-a.json")
    tiny(run_id="b", method="adamw").save(sweep / "specs" / "01-b.json")
    proc = c.start([PY, "-m", "edgebench.runner.sweep", str(sweep)])
    wait_for(lambda: stepping(sweep))
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc, 30)
    spec = RunSpec.load(sweep / "specs" / "00-a.json")
    spec.steps = 2
    spec.save(sweep / "specs" / "00-a.json")
    rc, out, err = c.run([PY, "-m", "edgebench.runner.sweep", str(sweep)], timeout=300)
    c.record("sweep killed then resumed", rc, out + err, error_expected=False)


def full_disk(c: Campaign) -> None:
    """A sweep whose run directory's disk (a 2 MiB tmpfs) fills up: it stops, saying why, every run with a result."""
    mount = c.home / "runs" / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        full = mount / "sweeps" / "s2"
        (full / "specs").mkdir(parents=True)
        tiny(run_id="c", steps=1_000_000, sample_hz=100.0).save(full / "specs" / "00-c.json")
        tiny(run_id="d").save(full / "specs" / "01-d.json")
        st = os.statvfs(mount)
        (mount / "filler").write_bytes(b"x" * (st.f_bavail * st.f_frsize - 500 * 1024))
        rc, out, err = c.run([PY, "-m", "edgebench.runner.sweep", str(full)], timeout=300)
        c.record("sweep on a full disk", rc, out + err)
        (mount / "filler").unlink()
        state = json.loads((full / "sweep.json").read_text())
        c.rows[-1]["detail"] = f"{state['state']}: {state.get('why')}"
        c.check_dirs(full / "runs")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def stepping_sweep(c: Campaign, sweep: Path, run_id: str):
    """(process, folder) of a sweep of one long tiny run, started and taking steps."""
    (sweep / "specs").mkdir(parents=True)
    tiny(run_id=run_id, steps=100_000).save(sweep / "specs" / f"00-{run_id}.json")
    proc = c.start([PY, "-m", "edgebench.runner.sweep", str(sweep)])
    wait_for(lambda: stepping(sweep))
    return proc, sweep


def deploy_while_running(c: Campaign, dev: Path) -> None:
    """A second deploy to a device whose sweep is running: refused (exit 2), nothing shipped or started."""
    before = set((dev / "sweeps").iterdir())
    c.inventory({"box": {"profile": "local", "kind": "local", "workdir": str(dev)}})
    c.cli("deploy while a sweep runs there", "deploy", "--device", "box", "--methods", "sgd", "--steps", "1",
          "--text-length", "16")
    c.rows[-1]["exit0_on_error"] = c.rows[-1]["rc"] != 2 or set((dev / "sweeps").iterdir()) != before


def killed_sweep_agrees(c: Campaign, dev: Path) -> None:
    """A sweep killed with SIGKILL: status, collect and the store give its run one final status."""
    proc, sweep = stepping_sweep(c, dev / "sweeps" / "s4", "f")
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc, 30)
    rc, out, _ = c.run([PY, "-m", "edgebench.cli", "status", "--device", "box", "--json"])
    shown = json.loads(out)[0]["sweeps"]["s4"]["runs"].get("f") if rc == 0 else None
    c.cli("collect after a killed sweep", "collect", "--device", "box", error_expected=False)
    import duckdb

    con = duckdb.connect(c.env["EDGEBENCH_STORE"], read_only=True)
    stored = (con.execute("SELECT status FROM runs WHERE device = 'box' AND run_id = 'f'").fetchone() or [None])[0]
    con.close()
    c.rows[-1]["detail"] = f"status {shown}, store {stored}"
    c.rows[-1]["no_final_status"] = not (shown == stored and stored in ("killed", "interrupted"))


def lab_down_mid_sweep(c: Campaign) -> None:
    """`lab down` while a lab device runs a sweep: its runs end with a final status on the device's
    disk; `lab down --purge` afterwards removes that disk too."""
    env = {**c.env, "EDGEBENCH_LAB_DIR": str(c.home / "runs" / "lab")}  # the lab's devices write under runs/

    def lab(name: str, *args: str) -> None:
        rc, out, err = c.run([PY, "-m", "edgebench.cli", *args], timeout=300, env=env)
        c.record(name, rc, out + err, error_expected=False)

    lab("lab up", "lab", "up", "--profile", "raspberry-pi-4-4gb", "--memory", "1GiB", "--cpus", "1")
    work = c.home / "runs" / "lab" / "lab-pi4" / "work"
    try:
        lab("deploy to the lab", "deploy", "--device", "lab-pi4", "--methods", "sgd,adamw", "--steps", "100000",
            "--text-length", "16")
        wait_for(lambda: stepping(work))
    finally:
        lab("lab down mid-sweep", "lab", "down")
    states = [json.loads(p.read_text()).get("state") for p in work.glob("sweeps/*/sweep.json")]
    unfinished = [d for d in run_dirs(work) if not (d / "result.json").exists()]
    c.rows[-1]["detail"] = f"sweep {', '.join(map(str, states))}; {len(unfinished)} run(s) without result.json"
    c.rows[-1]["no_final_status"] = not states or any(s in (None, "running") for s in states) or bool(unfinished)
    lab("lab down --purge after lab down", "lab", "down", "--purge")
    c.rows[-1]["no_final_status"] = work.exists()  # purge must remove what the plain down left


def run_dirs(root: Path) -> list[Path]:
    return sorted({p.parent for p in root.rglob("spec.json") if p.parent.name != "specs"})


def corrupted(run_dir: Path) -> bool:
    try:
        json.loads((run_dir / "result.json").read_text())
    except (OSError, ValueError):
        return (run_dir / "result.json").exists()
    return any(read_trace(run_dir / name).bad_lines for name in ("events.jsonl", "samples.jsonl")
               if (run_dir / name).exists())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="Keep the workspace and print its path.")
    parser.add_argument("--skip-faults", action="store_true", help="Only the bad inputs (fast).")
    parser.add_argument("--quick", action="store_true", help="A few cases of each kind (QUICK): about a minute.")
    args = parser.parse_args()
    for path in ESCAPES:
        subprocess.run(["rm", "-rf", str(path)], check=False)
    work = Path(tempfile.mkdtemp(prefix="edgebench-faults-"))
    c = Campaign(work, args.quick)
    try:
        return campaign(c, args.skip_faults)
    finally:
        try:
            c.limits.destroy()
        except CgroupError as exc:  # a lab device's group left inside it: `lab down` did not clean up
            print(f"cgroup left behind: {exc}")
        if args.keep:
            print(f"workspace: {work}")
        else:
            subprocess.run(["rm", "-rf", str(work)], check=False)


def campaign(c: Campaign, skip_faults: bool) -> int:
    """Runs the cases, prints each and the counts; 0 when every count of what went wrong is 0."""
    prepare_user_errors(c)
    canary = c.work / "outside.png"  # the image the hostile datasets point at: an access time before its change
    st = canary.stat()  # time, so that reading it moves the access time (relatime, as strictatime, records it)
    os.utime(canary, ns=(st.st_mtime_ns - 3600 * 10**9, st.st_mtime_ns))
    unread = canary.stat().st_atime_ns
    before = {p for p in c.work.rglob("*") if p.is_file()}
    t0 = time.monotonic()
    user_errors(c)
    hostile_listings(c)
    if not skip_faults:
        signals(c)
        sweeps(c)
        hostile_records(c)
    after = {p for p in c.work.rglob("*") if p.is_file()}
    outside = sorted(p for p in after - before if not p.is_relative_to(c.home / "runs") and p.parent != c.work)
    outside += [p for p in ESCAPES if p.exists()]
    dirs = run_dirs(c.home / "runs")
    no_result = [d for d in dirs if not (d / "result.json").exists()] + c.extra_dirs  # tmpfs: checked before unmount
    bad = [d for d in dirs if corrupted(d)]
    counts = {
        "cases": len(c.rows),
        "tracebacks": sum(r["traceback"] for r in c.rows),
        "internal errors": sum(r["internal_error"] for r in c.rows),
        "exit 0 on error": sum(r["exit0_on_error"] for r in c.rows),
        "hangs": sum(r["hang"] for r in c.rows),
        "killed at the memory limit": c.limits.memory_stats()["oom_kills"],
        "control sequences shown": sum(r["escapes"] for r in c.rows),
        "runs without a final status": sum(bool(r.get("no_final_status")) for r in c.rows),
        "run directories": len(dirs),
        "runs without result.json": len(no_result),
        "corrupted run directories": len(bad),
        "host reads outside what was given": int(canary.stat().st_atime_ns != unread),
        "host writes outside runs/": len(outside),
    }
    for r in c.rows:
        flag = (" <-- TRACEBACK" if r["traceback"] else " <-- INTERNAL ERROR" if r["internal_error"] else
                " <-- HUNG" if r["hang"] else " <-- EXIT 0" if r["exit0_on_error"] else
                " <-- ESCAPE SEQUENCE SHOWN" if r["escapes"] else " <-- NO FINAL STATUS" if r.get("no_final_status")
                else "")
        print(f"  rc={r['rc']!s:>4} {r['s']:5.1f} s  {r['case']}{'  (' + r['detail'] + ')' if r.get('detail') else ''}"
              f"{flag}")
    for label, items in (("without result.json", no_result), ("corrupted", bad), ("written outside runs/", outside)):
        for item in items:
            print(f"  {label}: {item}")
    print(f"campaign: {time.monotonic() - t0:.0f} s")
    for key, value in counts.items():
        print(f"{key}: {value}")
    return 0 if all(v == 0 for k, v in counts.items() if k not in ("cases", "run directories")) else 1


if __name__ == "__main__":
    sys.exit(main())
