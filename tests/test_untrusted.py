"""What comes from outside (issue 28): names from a device, a file or the command line never choose
where edgebench writes or reads (one rule: edgebench.untrusted), text from a device reaches the
terminal without control characters, and bad input is refused before any run starts (exit 2, one
line naming the file or field and the fix)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgebench.untrusted import UnsafeName, inside, path_name, printable
from test_data import GOOD, _folder

PY = sys.executable
HOSTILE = "sgd\x1b]0;pwned\x07\x1b[2J\x1b[31m\x9b2J"  # title, clear screen, colour, C1 CSI


def edgebench(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "edgebench.cli", *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def one_line_exit_2(done: subprocess.CompletedProcess, *words: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")} if root.exists() else set()


# --- the rule itself --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../x", "/abs", "a/b", ".hidden", "..", ".", "", "x\x00y", "a\\b", None, 5])
def test_a_path_name_is_one_plain_component(name):
    with pytest.raises(UnsafeName, match="not a safe file name"):
        path_name(name, "run id")


def test_inside_refuses_dotdot_absolute_and_symlinks_out(tmp_path):
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "outside.png").write_bytes(b"x")
    os.symlink(tmp_path / "outside.png", tmp_path / "data" / "link.png")
    os.symlink(tmp_path, tmp_path / "data" / "up")
    assert inside(tmp_path / "data", "sub/a.png", "image") == tmp_path / "data" / "sub" / "a.png"
    for bad in ("../outside.png", "/etc/passwd", "sub/../../outside.png", "./a.png", "sub//a.png", "link.png",
                "up/outside.png", "..\\outside.png"):
        with pytest.raises(UnsafeName):
            inside(tmp_path / "data", bad, "image")


def test_printable_removes_escape_sequences_and_control_characters():
    text = printable(f"model {HOSTILE} ok\tdone \r\x00\u202eevil\nnext")
    assert text == "model sgd ok done evil\nnext"
    assert printable("a\nb", newlines=False) == "a b"
    assert "\x1b" not in printable("\x1b[?25l\x1bP+q\x1b\\\x1b7x")


# --- names from the command line: ingest, import-trace, devices add ------------------------

@pytest.mark.parametrize("device", ["../../../evildev", "/tmp/edgebench-evil-abs", ".hidden"])
def test_ingest_refuses_a_device_name_that_is_a_path(tmp_path, edgebench_here, device):
    from results_fixtures import FakeRun

    run = FakeRun(run_id="r1").write(tmp_path / "src")
    work = tmp_path / "w"
    work.mkdir()
    before = files_under(tmp_path)
    done = edgebench_here("ingest", str(run), "--device", device, "--store", "s/store.duckdb", cwd=work)
    one_line_exit_2(done, "device name", "not a safe file name")
    assert files_under(tmp_path) == before and not Path("/tmp/edgebench-evil-abs").exists()
    assert not (tmp_path.parent / "evildev").exists()
    done = edgebench_here("import-trace", str(run / "samples.jsonl"), "--device", device, "--power-col", "power_w",
                          "--store", "s/store.duckdb", cwd=work)
    one_line_exit_2(done, "not a safe file name")


def test_ingest_refuses_a_run_id_that_is_a_path_or_a_raw_folder_that_links_out(tmp_path, edgebench_here):
    from results_fixtures import FakeRun

    run = FakeRun(run_id="r1").write(tmp_path / "src")
    meta = json.loads((run / "meta.json").read_text())
    for hostile in ("../../../../escape-meta", "/tmp/edgebench-escape-meta"):
        (run / "meta.json").write_text(json.dumps({**meta, "run_id": hostile}))
        done = edgebench_here("ingest", str(run), "--store", "s/store.duckdb", cwd=tmp_path)
        one_line_exit_2(done, "meta.json: run_id", "not a safe file name")
    assert not (tmp_path / "s" / "raw").exists() and not Path("/tmp/edgebench-escape-meta").exists()
    (run / "meta.json").write_text(json.dumps(meta))
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "s" / "raw").mkdir(parents=True)
    os.symlink(outside, tmp_path / "s" / "raw" / "local")  # raw/<device> leads out of the store's folder
    done = edgebench_here("ingest", str(run), "--store", "s/store.duckdb", cwd=tmp_path)
    one_line_exit_2(done, "leads outside")
    assert list(outside.iterdir()) == []


def _confined(args: list[str], cwd: Path, cgroup: Path, limit: int = 768 * 2**20) -> subprocess.CompletedProcess:
    """`edgebench ARGS` in a memory cgroup of `limit` with a 120 s timeout: a hostile file that
    read without end would end it, not the host."""
    (cgroup / "memory.limit_in_bytes").write_text(str(limit))
    return subprocess.run([sys.executable, "-m", "edgebench.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, preexec_fn=lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())))


def test_a_run_directory_s_files_are_regular_files_inside_it(tmp_path, memory_cgroup):
    from results_fixtures import FakeRun

    secret = tmp_path / "secret.txt"
    secret.write_text("TOKEN=hunter2\n")
    cases = {"samples.jsonl": lambda p: os.symlink("/dev/zero", p), "events.jsonl": os.mkfifo,
             "result.json": lambda p: os.symlink(secret, p)}
    for name, make in cases.items():
        run = FakeRun(run_id=f"r-{name.split('.')[0]}").write(tmp_path / "src")
        (run / name).unlink()
        make(run / name)
        done = _confined(["ingest", str(run), "--store", "s/store.duckdb"], tmp_path, memory_cgroup)
        one_line_exit_2(done, "run file", name)
        assert "hunter2" not in done.stderr + done.stdout
        assert not (tmp_path / "s" / "raw").exists() or not list((tmp_path / "s" / "raw").rglob(name))
    big = FakeRun(run_id="r-big").write(tmp_path / "src")
    with open(big / "meta.json", "r+b") as fh:  # a sparse 65 MiB meta.json: refused by its size, unread
        fh.truncate(65 * 2**20)
    one_line_exit_2(_confined(["ingest", str(big), "--store", "s/store.duckdb"], tmp_path, memory_cgroup),
                    "more than the 67,108,864 bytes")


def test_a_dataset_s_files_are_regular_files_inside_it(tmp_path, memory_cgroup):
    (tmp_path / "elsewhere").mkdir()
    outside = _folder(tmp_path / "elsewhere", GOOD)
    for name, make in {"data.jsonl": os.mkfifo, "tokenizer.json": lambda p: os.symlink(outside / "tokenizer.json", p),
                       "a.png": lambda p: os.symlink("/dev/urandom", p)}.items():
        folder = tmp_path / f"data-{name.split('.')[0]}"
        folder.mkdir()
        _folder(folder, GOOD)
        (folder / name).unlink()
        make(folder / name)
        done = _confined(["bench", "--data", str(folder), "--methods", "sgd", "--steps", "1", "--runs-dir", "runs"],
                         tmp_path, memory_cgroup, 2 * 2**30)
        one_line_exit_2(done, name)
        assert "not a regular file" in done.stderr or "leads outside" in done.stderr, done.stderr
        assert not (tmp_path / "runs").exists()


def test_devices_add_checks_the_name_before_contacting_the_board(tmp_path, edgebench_here):
    done = edgebench_here("devices", "add", "../../evil", "--host", "203.0.113.1", cwd=tmp_path,
                          env={"EDGEBENCH_INVENTORY": str(tmp_path / "inv.yaml")})
    one_line_exit_2(done, "not a safe file name")
    assert not (tmp_path / "inv.yaml").exists()


# --- names from a device: collect ------------------------------------------------------------

def _device(tmp_path: Path, run_id: str = "r0", meta_run_id: str | None = None) -> Path:
    """A local-transport device with one finished tiny run, its meta.json's run_id as given."""
    from results_fixtures import FakeRun

    work = tmp_path / "dev"
    sweep = work / "sweeps" / "s1"
    run = FakeRun(run_id=run_id, method=HOSTILE).write(sweep / "runs")
    if meta_run_id is not None:
        meta = json.loads((run / "meta.json").read_text())
        (run / "meta.json").write_text(json.dumps({**meta, "run_id": meta_run_id}))
    (sweep / "sweep.json").write_text(json.dumps({"state": "finished", "runs": {run_id: "ok"}}))
    (tmp_path / "inv.yaml").write_text(json.dumps({"devices": {"box": {"profile": "local", "kind": "local",
                                                                         "workdir": str(work)}}}))
    return work


@pytest.mark.parametrize("meta_run_id", ["../../../../escape-collect", "/tmp/edgebench-escape-collect", "other"])
def test_collect_refuses_a_meta_run_id_that_is_not_the_listed_run(tmp_path, edgebench_here, meta_run_id):
    _device(tmp_path, meta_run_id=meta_run_id)
    host = tmp_path / "host"
    host.mkdir()
    done = edgebench_here("collect", "--device", "box", "--runs-dir", "runs", "--store", "runs/s.duckdb", cwd=host,
                          env={"EDGEBENCH_INVENTORY": str(tmp_path / "inv.yaml")})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "refused r0" in done.stderr and "meta.json: run_id" in done.stderr
    assert not (host / "runs" / "raw").exists() and not (tmp_path / "escape-collect").exists()
    assert not Path("/tmp/edgebench-escape-collect").exists()
    import duckdb

    assert duckdb.connect(str(host / "runs" / "s.duckdb"), read_only=True).execute(
        "SELECT count(*) FROM runs").fetchone() == (0,)


def test_collect_refuses_a_run_folder_that_links_out(tmp_path, edgebench_here):
    _device(tmp_path)
    host, outside = tmp_path / "host", tmp_path / "outside"
    (host / "runs" / "box").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, host / "runs" / "box" / "r0")
    done = edgebench_here("collect", "--device", "box", "--runs-dir", "runs", cwd=host,
                          env={"EDGEBENCH_INVENTORY": str(tmp_path / "inv.yaml")})
    assert done.returncode == 1 and "leads outside" in done.stderr and "Traceback" not in done.stderr
    assert list(outside.iterdir()) == []


def test_a_non_json_listing_says_what_the_device_printed(tmp_path, edgebench_here):
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho 'Welcome to the board!'\n")
    fake.chmod(0o755)
    (tmp_path / "inv.yaml").write_text(json.dumps({"devices": {"box": {
        "profile": "local", "kind": "local", "python": str(fake), "workdir": str(tmp_path / "dev")}}}))
    done = edgebench_here("collect", "--device", "box", "--runs-dir", "runs", cwd=tmp_path,
                          env={"EDGEBENCH_INVENTORY": str(tmp_path / "inv.yaml")})
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "printed 'Welcome to the board!', not the JSON expected" in done.stderr and "line 1 column 1" in done.stderr


# --- names from a file: a dataset's JSONL -----------------------------------------------------

@pytest.mark.parametrize("image", ["../outside.png", "OUTSIDE_ABS", "link.png", "sub/../../outside.png"])
def test_a_dataset_image_outside_the_folder_is_refused(tmp_path, edgebench_here, image):
    from PIL import Image

    from edgebench.data.folder import DatasetError, FolderDataset

    folder = tmp_path / "data"
    folder.mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "outside.png")
    os.symlink(tmp_path / "outside.png", folder / "link.png")
    image = str(tmp_path / "outside.png") if image == "OUTSIDE_ABS" else image
    _folder(folder, [GOOD[0], json.dumps({"image": image, "question": "what ?", "answer": "red"})])
    with pytest.raises(DatasetError, match=r"data.jsonl:2: image .* (must be a path inside|leads outside)"):
        FolderDataset(folder)
    done = edgebench_here("bench", "--data", str(folder), "--methods", "sgd", cwd=tmp_path)
    one_line_exit_2(done, "--data", "data.jsonl:2")
    assert not (tmp_path / "runs").exists()


# --- checks before any run ------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from edgebench.model import build_model
    from edgebench.model.checkpoint import save_pretrained

    return save_pretrained(build_model("tiny"), tmp_path_factory.mktemp("ckpt") / "good")


def _broken_checkpoint(tmp_path: Path, good: Path, kind: str) -> Path:
    import shutil

    folder = tmp_path / kind
    shutil.copytree(good, folder)
    weights, config = folder / "model.safetensors", folder / "config.json"
    data = json.loads(config.read_text())
    if kind == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "empty":
        weights.write_bytes(b"")
    elif kind == "garbage":
        weights.write_bytes(os.urandom(4096))
    elif kind == "no-weights":
        weights.unlink()
    elif kind == "missing-key":
        del data["vit_hidden_dim"]
    elif kind == "negative-blocks":
        data["lm_n_blocks"] = -3
    elif kind == "other-shape":
        data["lm_hidden_dim"] = 96
        data["lm_n_heads"] = 4
        data["lm_n_kv_heads"] = 2
    elif kind == "nan":  # what a diverged run saves
        import torch
        from safetensors.torch import load_file, save_file

        save_file({k: torch.full_like(v, float("nan")) for k, v in load_file(str(weights)).items()}, str(weights))
    elif kind == "int32":  # the right names and shapes, the wrong dtype (a quantised export, say)
        import torch
        from safetensors.torch import load_file, save_file

        save_file({k: v.to(torch.int32) for k, v in load_file(str(weights)).items()}, str(weights))
    config.write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("kind,words", [
    ("truncated", ["model.safetensors: damaged"]), ("empty", ["model.safetensors: empty"]),
    ("garbage", ["model.safetensors: damaged"]), ("no-weights", ["model.safetensors: missing"]),
    ("missing-key", ["config.json: missing field(s) vit_hidden_dim"]),
    ("negative-blocks", ["config.json: VLMConfig.lm_n_blocks: -3 is out of range"]),
    ("other-shape", ["does not match the model", "shape mismatch"]),
    ("int32", ["tensors are not floating point", "(I32)"]),
    ("nan", ["tensors hold NaN or infinite values", "use an earlier checkpoint"]),
])
def test_a_broken_checkpoint_is_refused_before_any_run(tmp_path, edgebench_here, checkpoint, kind, words):
    folder = _broken_checkpoint(tmp_path, checkpoint, kind)
    done = edgebench_here("bench", "--model", str(folder), "--methods", "sgd", cwd=tmp_path)
    one_line_exit_2(done, "--model", *words)
    assert not (tmp_path / "runs").exists()
    done = edgebench_here("models", "--load", str(folder), cwd=tmp_path)
    one_line_exit_2(done, *words)


def test_images_are_checked_by_type_and_size_before_any_run(tmp_path, edgebench_here):
    from PIL import Image

    from edgebench.data.folder import DatasetError, FolderDataset, pixel_limit
    from edgebench.model.config import get_config

    folder = tmp_path / "data"
    folder.mkdir()
    _folder(folder, GOOD + [json.dumps({"image": "c.jpg", "question": "what ?", "answer": "red"})])
    (folder / "c.jpg").write_text("not an image at all\n")
    with pytest.raises(DatasetError, match=r"data.jsonl:3: .*c.jpg is not an image Pillow reads"):
        FolderDataset(folder).check(get_config("tiny"), 32)
    done = edgebench_here("bench", "--data", str(folder), "--methods", "sgd", cwd=tmp_path)
    one_line_exit_2(done, "--data", "data.jsonl:3", "not an image")
    limit = pixel_limit(get_config("tiny"))
    assert limit == 4096 * 4096 and pixel_limit(get_config("nanovlm-460m")) == 16 * 2048 * 2048
    Image.new("1", (5000, 4000)).save(folder / "c.jpg", format="PNG")  # 20 Mpx, a few KiB on disk
    with pytest.raises(DatasetError, match=r"data.jsonl:3: image .*c.jpg has 5000x4000 = 20,000,000 pixels; this "
                                           r"model decodes at most 16,777,216"):
        FolderDataset(folder).check(get_config("tiny"), 32)
    FolderDataset(folder).check(get_config("nanovlm-460m"), 64)  # within the 460M model's own need
    Image.new("1", (9000, 9000)).save(folder / "c.jpg", format="PNG")  # past twice the limit: Pillow's own refusal
    with pytest.raises(DatasetError, match=r"c.jpg has more than 33,554,432 pixels; this model decodes at most"):
        FolderDataset(folder).check(get_config("tiny"), 32)


@pytest.mark.parametrize("args,words", [
    (["--lr", "inf"], ["--lr", "not a finite number"]), (["--lr", "nan"], ["--lr", "not a finite number"]),
    (["--weight-decay", "-0.1"], ["--weight-decay", "of 0 or more", "0: no decay"]),
    (["--weight-decay", "nan"], ["--weight-decay", "not a finite number"]),
    (["--weight-decay", "inf"], ["--weight-decay", "not a finite number"]),
    (["--timeout", "nan"], ["--timeout"]),
    (["--text-length", "100000000"], ["--text-length", "lm_max_position_embeddings 1,024", "at most 1,008"]),
    (["--batch-size", "100000000"], ["predicted peak", "613.2 TiB", "lower --batch-size", "--force"]),
    (["--model", "nanovlm-222m", "--methods", "adamw", "--batch-size", "64"], ["adamw", "methods that fit"]),
])
def test_run_shape_is_checked_before_any_run(tmp_path, edgebench_here, args, words):
    done = edgebench_here("bench", *args, cwd=tmp_path)
    one_line_exit_2(done, *words)
    assert not (tmp_path / "runs").exists()


def test_memory_preflight_refuses_then_force_runs_and_records_it(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from edgebench.devices.profiles import REPO_PROFILES_DIR
    from edgebench.fleet.commands.bench import bench

    profiles = tmp_path / "profiles"  # this host as a 256 MiB board: its profile's RAM bounds what it reports
    profiles.mkdir()
    (profiles / "local.yaml").write_text((REPO_PROFILES_DIR / "local.yaml").read_text().replace(
        "ram_bytes: auto", "ram_bytes: 256MiB"))
    monkeypatch.setenv("EDGEBENCH_PROFILES", str(profiles))
    args = ["--methods", "sgd", "--steps", "1", "--warmup", "0", "--text-length", "16", "--runs-dir",
            str(tmp_path / "runs")]
    out = CliRunner().invoke(bench, args)
    assert out.exit_code == 1 and "predicted peak (estimate) sgd" in out.output  # ClickException: exit 2 via main
    said = "the 208 MiB a run may take on this host (256 MiB RAM less 0 MiB for its OS at idle"
    assert said in out.output and "40 MiB for the Python supervisor, 8 MiB margin" in out.output
    assert not (tmp_path / "runs").exists()
    out = CliRunner().invoke(bench, args + ["--force"])
    assert out.exit_code == 0, out.output
    (meta,) = (tmp_path / "runs").glob("*/meta.json")
    extra = json.loads(meta.read_text())["spec"]["extra"]
    assert said in extra["forced"]["memory"] and extra["forced"]["peak_bytes_est"] > 208 * 2**20
    held_to = extra["budget"]  # the budget the run was held to, recorded with it
    assert held_to["budget_bytes"] == 256 * 2**20 - 40 * 2**20 - int(256 * 2**20 * 0.03)


def test_bench_exits_1_when_no_run_ended_ok_and_says_how_many_did(tmp_path, edgebench_here):
    done = edgebench_here("bench", "--methods", "sgd", "--timeout", "0.01", "--text-length", "16", cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "local: 0 of 1 runs ended ok (1 timeout)" in done.stderr


def test_deploy_spec_with_an_unknown_model_is_refused_on_the_host(tmp_path, edgebench_here):
    (tmp_path / "spec.json").write_text(json.dumps({"model": "tinyy", "method": "sgd"}))
    done = edgebench_here("deploy", "--device", "local", "--spec", "spec.json", "--runs-dir", "runs", cwd=tmp_path)
    one_line_exit_2(done, "--spec", "spec.json: model: unknown model 'tinyy'")
    (tmp_path / "spec.json").write_text(json.dumps({"model": "tiny", "method": "sgd", "lr": "nan"}))
    done = edgebench_here("deploy", "--device", "local", "--spec", "spec.json", "--runs-dir", "runs", cwd=tmp_path)
    one_line_exit_2(done, "spec.json: lr: 'nan' is not a finite number")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, words", [
    (("bench", "--threads", "100000"), ("--threads", "100000 is not in the range 1<=x<=1024")),
    (("bench", "--steps", "2000000"), ("--steps", "not in the range 1<=x<=1000000")),
    (("bench", "--methods", "sgd+accum2000000000"), ("accumN: N is at most 1024", "'2000000000'")),
    (("deploy", "--device", "local", "--spec", "steps.json"), ("steps.json: steps:", "1<=x<=1000000")),
    (("deploy", "--device", "local", "--spec", "threads.json"), ("threads.json: threads:", "1<=x<=1024")),
    (("deploy", "--device", "local", "--spec", "accum.json"), ("accum.json: method:", "at most 1024")),
])
def test_counts_past_their_limit_are_refused_naming_the_field_and_the_limit(tmp_path, edgebench_here, args, words):
    """A count from the command line or a spec file (steps 1e20, accum2000000000, 100000 threads)
    is refused in one line before anything starts, not run until it ends or crashes the worker."""
    for name, field in (("steps", {"steps": 1e20}), ("threads", {"threads": 100000}),
                        ("accum", {"method": "sgd+accum" + "9" * 5000})):
        (tmp_path / f"{name}.json").write_text(json.dumps({"model": "tiny", "method": "sgd", **field}))
    done = edgebench_here(*args, "--runs-dir", "runs", cwd=tmp_path)
    line = one_line_exit_2(done, *words)
    assert len(line) < 400 and not (tmp_path / "runs").exists()


# --- text from devices reaches the terminal printable -----------------------------------------

def test_report_and_live_show_device_strings_without_escapes(tmp_path, edgebench_here):
    import io

    from rich.console import Console

    from edgebench.figures.run_meta import RunMeta
    from edgebench.live.state import LiveState
    from edgebench.live.view import render
    from results_fixtures import FakeRun

    run = FakeRun(run_id="r1", method=HOSTILE, status="error").write(tmp_path / "src")
    result = json.loads((run / "result.json").read_text())
    (run / "result.json").write_text(json.dumps({**result, "detail": f"boom {HOSTILE}"}))
    assert edgebench_here("ingest", str(run), "--store", "s.duckdb", cwd=tmp_path).returncode == 0
    for args in ([], ["--format", "csv"]):
        out = subprocess.run(["script", "-qec", " ".join([PY, "-m", "edgebench.cli", "report", "--store", "s.duckdb",
                                                          *args]), "/dev/null"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)  # a real terminal
        assert "sgd" in out.stdout and "pwned" not in out.stdout  # the title sequence is gone whole
        assert "\x1b]" not in out.stdout and "\x07" not in out.stdout and "[2J" not in out.stdout
    meta = RunMeta.from_json({**json.loads((run / "meta.json").read_text()), "run_id": HOSTILE}, "meta.json")
    state = LiveState(source=str(run), meta=meta, result={**result, "detail": HOSTILE, "status": HOSTILE},
                      errors=[HOSTILE])
    buffer = io.StringIO()
    Console(file=buffer, force_terminal=True, width=120).print(render(state, now=0))
    shown = buffer.getvalue()
    assert "sgd" in shown and "pwned" not in shown
    assert "\x1b]" not in shown and "\x07" not in shown and "[2J" not in shown


def test_printable_cuts_a_long_value_short():
    assert printable(HOSTILE + "x" * 10**6, newlines=False, limit=50) == "sgd" + "x" * 46 + "…"
    assert printable("short", limit=50) == "short"


def test_status_shows_what_a_device_says_printable_and_short(tmp_path, edgebench_here):
    sweep = tmp_path / "work" / "sweeps" / "s1"
    sweep.mkdir(parents=True)
    (sweep / "sweep.json").write_text(json.dumps({"state": "finished", "why": HOSTILE * 10_000,
                                                  "runs": {"r1": HOSTILE + "x" * 100_000}}))
    (tmp_path / "inv.yaml").write_text(f"devices:\n  box: {{profile: local, workdir: {tmp_path / 'work'}}}\n")
    done = edgebench_here("status", "--device", "box", cwd=tmp_path,
                          env={"EDGEBENCH_INVENTORY": str(tmp_path / "inv.yaml")})
    assert done.returncode == 0 and "box: sweep s1: finished (sgd" in done.stdout, done.stdout[-500:] + done.stderr
    assert "  r1: sgdxxx" in done.stdout and "\x1b" not in done.stdout and "pwned" not in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) < 700


def test_report_charts_draw_device_strings_printable_and_short(tmp_path, edgebench_here):
    """matplotlib warns "Glyph 27 (\x1b) missing" with the character itself: a device's method name is
    made printable and cut short before it is drawn, so nothing of it reaches the terminal, and a
    terminal table shows it cut short too."""
    from PIL import Image

    from results_fixtures import FakeRun

    method = HOSTILE + "x" * 10_000  # far past a chart's width (more than RunMeta's 16,384 is refused at ingest)
    run = FakeRun(run_id="r1", method=method).write(tmp_path / "src")
    assert edgebench_here("ingest", str(run), "--store", "s.duckdb", cwd=tmp_path).returncode == 0
    for args in (["--format", "png", "--out", "figs"], ["--format", "html", "--out", "r.html"], []):
        done = edgebench("report", "--store", "s.duckdb", *args, cwd=tmp_path)
        said = done.stdout + done.stderr
        assert done.returncode == 0 and "Glyph" not in said and "pwned" not in said, said[-2000:]
        assert not {"\x1b", "\x07", "\x9b"} & set(said) and len(said) < 20_000
    for png in (tmp_path / "figs").glob("*.png"):
        drawn = Image.open(png).text["Description"]
        assert "sgd" in drawn and "pwned" not in drawn and not {"\x1b", "\x07", "\x9b"} & set(drawn)
        assert max(len(line) for line in drawn.splitlines()) < 500


def test_bench_results_table_and_one_line_errors_are_printable(tmp_path):
    import io

    from rich.console import Console

    from edgebench.cli import _one_line
    from edgebench.report.tables import render_bench_results

    buffer = io.StringIO()
    render_bench_results([{"method": HOSTILE, "status": "error", "detail": HOSTILE, "run_id": "r"}], HOSTILE,
                         console=Console(file=buffer, force_terminal=True, width=100))
    assert "\x1b]" not in buffer.getvalue() and "[2J" not in buffer.getvalue()
    assert _one_line(RuntimeError(f"device said {HOSTILE}")) == "device said sgd"


# --- smaller messages and leftovers -----------------------------------------------------------

def test_import_trace_names_the_file_line_and_column_of_a_bad_number(tmp_path, edgebench_here):
    (tmp_path / "m.csv").write_text("time,watts\n1.0,2.5\n2.0,abc\n")
    done = edgebench_here("import-trace", "m.csv", "--device", "pi", "--power-col", "watts", "--store", "s.duckdb",
                          cwd=tmp_path)
    one_line_exit_2(done, "m.csv:3: column 'watts' holds 'abc', not a number")
    (tmp_path / "m.csv").write_text("time,watts\nsoon,2.5\n")
    done = edgebench_here("import-trace", "m.csv", "--device", "pi", "--power-col", "watts", "--store", "s.duckdb",
                          cwd=tmp_path)
    one_line_exit_2(done, "m.csv:2: column 'time' holds 'soon'")


def test_report_on_a_sqlite_file_is_refused_before_duckdb_opens_it(tmp_path, edgebench_here):
    import sqlite3

    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (a INT)")
    con.commit()
    con.close()
    done = edgebench_here("report", "--store", "other.db", cwd=tmp_path)
    one_line_exit_2(done, "other.db: a SQLite database, not an edgebench results store")
    assert "extension" not in done.stderr


def test_staging_folders_of_killed_exports_are_removed(tmp_path):
    import fcntl

    from exporters.pipeline import _remove_stale_staging

    for name in ("a" * 24, "b" * 24):
        (tmp_path / f".{name}-k1ll3d00").mkdir()
        (tmp_path / f".{name}-k1ll3d00" / "model.pte").write_bytes(b"half")
        (tmp_path / f".{name}.lock").write_text("")
    with open(tmp_path / f".{'b' * 24}.lock", "a") as held:  # an export building b right now
        fcntl.flock(held, fcntl.LOCK_EX)
        _remove_stale_staging(tmp_path)
    assert not (tmp_path / f".{'a' * 24}-k1ll3d00").exists()
    assert (tmp_path / f".{'b' * 24}-k1ll3d00").exists()


def test_deploy_ships_only_what_the_datasets_jsonl_uses_and_counts_it(tmp_path):
    from edgebench.devices.inventory import get_device
    from edgebench.devices.transport import LocalTransport
    from edgebench.fleet import assets
    from edgebench.fleet.deploy import _ship_tar, _tar_dir
    from edgebench.runner.spec import RunSpec

    folder = tmp_path / "data"
    (folder / "images").mkdir(parents=True)
    _folder(folder, GOOD)
    with open(folder / "unused.bin", "wb") as fh:  # a 1 GiB sparse file nothing references
        fh.truncate(1 << 30)
    (folder / "images" / "other.png").write_bytes(b"x" * 1000)
    spec = RunSpec(data_dir=str(folder))
    plan = assets.plan_assets([spec])[str(folder)]
    assert sorted(plan.files) == ["a.png", "b.png", "data.jsonl", "tokenizer.json"] and not plan.whole
    assert plan.size_bytes == sum((folder / f).stat().st_size for f in plan.files)
    device, work = get_device("local"), tmp_path / "device-workdir"
    with LocalTransport(device) as transport:
        def unshipped() -> int:
            return assets.unshipped_bytes({"d": plan}, assets.check_cache(transport, device, str(work), {"d": plan}))

        assert unshipped() == plan.size_bytes
        assets.ship_assets(transport, device, [spec], str(work), tmp_path, _ship_tar, _tar_dir)
        assert unshipped() == 0  # on the device now
    shipped = {p.name for p in Path(spec.data_dir).rglob("*") if p.is_file()}
    assert shipped == {"a.png", "b.png", "data.jsonl", "tokenizer.json"}


def test_quote_is_a_short_printable_prefix_of_any_value():
    """An error names a bad value by a short repr: a 1 MB string, an escape sequence, a value
    shared a billion times by YAML aliases all give a few dozen characters, at once."""
    from edgebench.untrusted import quote

    assert quote("x" * 2**20).endswith("...") and len(quote("x" * 2**20)) == 60
    assert quote("sgd\x1b]0;pwned\x07\x1b[2J") == "'sgd\\x1b]0;pwned\\x07\\x1b[2J'"  # repr escapes it
    assert "\n" not in quote(["a\nb"] * 3) and quote(3) == "3"
    shared: list = ["x"] * 9
    for _ in range(9):
        shared = [shared] * 9  # 9**10 values if walked
    assert len(quote(shared)) <= 60
