"""`edgebench bench` end to end, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from edgebench.figures.run import figures_of_run_dir
from edgebench.fleet.commands.bench import bench
from edgebench.report.tables import render_bench_results
from edgebench.runner.spec import RunSpec
from layout_checks import names_beside_figures


def test_bench_json_end_to_end(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "edgebench.cli", "bench", "--device", "local", "--model", "tiny",
         "--steps", "3", "--json", "--runs-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=True)
    results = json.loads(out.stdout)
    assert [r["method"] for r in results] == ["adamw", "sgd"]
    for r in results:
        assert r["status"] == "ok", r["detail"]
        assert r["steps_done"] == 3
        assert r["peak_rss_bytes_kernel"] > 50 * 2**20
        assert r["step_time_s"]["median"] > 0
        assert r["samples_per_s"] > 0
        run_dir = Path(r["run_dir"])
        assert (run_dir / "result.json").exists() and (run_dir / "samples.jsonl").exists()
    from edgebench.results.store import Store

    with Store(tmp_path / "edgebench.duckdb", read_only=True) as store:
        stored = {r["run_id"]: r["status"] for r in store.runs(device="local")}
    assert stored == {r["run_id"]: "ok" for r in results}


def test_bench_refuses_remote_devices_with_the_way_to_go(tmp_path, edgebench_here):
    out = edgebench_here("bench", "--device", "jetson-orin", cwd=tmp_path)
    assert out.returncode == 2
    assert "edgebench deploy --device jetson-orin" in out.stderr


def test_bench_onnxruntime_exports_runs_torch_free_and_records_refusals(tmp_path, export_cache):
    out = subprocess.run(
        [sys.executable, "-m", "edgebench.cli", "bench", "--model", "tiny", "--backend", "onnxruntime",
         "--methods", "sgd,forward-grad", "--steps", "2", "--json", "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300, check=True)
    sgd, refused = json.loads(out.stdout)
    assert sgd["status"] == "ok", sgd["detail"]
    assert sgd["backend"] == "onnxruntime" and sgd["steps_done"] == 2
    # No torch in the device process: far below the ~300 MB torch import alone.
    assert sgd["peak_rss_bytes_kernel"] < 200 * 2**20
    assert refused["status"] == "unsupported"
    assert "forward-mode" in refused["detail"] and "--backend eager" in refused["detail"]


def test_bench_fails_like_deploy_when_no_method_can_run(tmp_path, edgebench_here):
    out = edgebench_here("bench", "--model", "tiny", "--backend", "onnxruntime", "--methods", "forward-grad",
                         "--steps", "1", "--json", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert [r["status"] for r in json.loads(out.stdout)] == ["unsupported"]  # still recorded for scripts
    line = out.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("local: no method can run there (onnxruntime): forward-grad: ") and "forward-mode" in line


def _checkpoint_and_data(root: Path) -> tuple[Path, Path]:
    """A tiny nanoVLM checkpoint folder and a two-line folder dataset, as a user brings them."""
    import torch
    from PIL import Image
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from edgebench.model import build_model
    from edgebench.model.checkpoint import save_pretrained

    torch.manual_seed(0)
    save_pretrained(build_model("tiny"), root / "my-vlm")
    data = root / "my-data"
    data.mkdir()
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["what colour is the ball ? red blue"],
                                  trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<eos>"]))
    tokenizer.save(str(data / "tokenizer.json"))
    lines = []
    for name, colour, answer in (("a.png", (255, 0, 0), "red"), ("b.png", (0, 0, 255), "blue")):
        Image.new("RGB", (20, 10), colour).save(data / name)
        lines.append(json.dumps({"image": name, "question": "what colour is the ball ?", "answer": answer}))
    (data / "data.jsonl").write_text("\n".join(lines) + "\n")
    return root / "my-vlm", data


def test_bench_fine_tunes_my_checkpoint_on_my_data_with_repeats(tmp_path):
    model, data = _checkpoint_and_data(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "edgebench.cli", "bench", "--model", str(model), "--data", str(data), "--lr", "0.01",
         "--methods", "sgd", "--repeats", "2", "--steps", "2", "--text-length", "16", "--json",
         "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300, check=True)
    assert out.stderr == ""  # nothing but its own output: no library chatter
    results = json.loads(out.stdout)
    assert [r["status"] for r in results] == ["ok", "ok"], [r.get("detail") for r in results]
    specs = [json.loads((Path(r["run_dir"]) / "spec.json").read_text()) for r in results]
    assert [s["repeat"] for s in specs] == [0, 1]
    for spec in specs:
        assert (spec["checkpoint"], spec["data_dir"], spec["lr"], spec["model"]) == (
            str(model.resolve()), str(data.resolve()), 0.01, "my-vlm")
    assert results[0]["loss_first"] == results[1]["loss_first"]  # same weights, same data, same seed
    for r in results:
        assert set(r["cpu"]) >= {"others_share", "steal_share", "load_1m", "disturbed"}  # the noise guard
        assert r["predicted_peak_bytes_est"] > 0  # the memory model reads the checkpoint's config
    from edgebench.results.store import Store

    with Store(tmp_path / "runs" / "edgebench.duckdb", read_only=True) as store:
        assert {r["model"] for r in store.runs()} == {"my-vlm"}


def test_bench_reads_the_tokenizer_where_tokenizer_says(tmp_path):
    """--tokenizer wins over the dataset's and the model's (theirs are no tokenizers here). The
    README's example trains with the tokenizer beside the model's config.json, where Hugging Face
    saves it, and a dataset without one (test_readme_your_model_your_data_example_runs_as_written)."""
    model, data = _checkpoint_and_data(tmp_path)
    mine = tmp_path / "tokenizers" / "tokenizer.json"
    mine.parent.mkdir()
    (data / "tokenizer.json").rename(mine)
    for folder in (data, model):
        (folder / "tokenizer.json").write_text("{}")
    args = ["--tokenizer", str(mine.parent)]
    out = subprocess.run(
        [sys.executable, "-m", "edgebench.cli", "bench", "--model", str(model), "--data", str(data), *args,
         "--methods", "sgd", "--steps", "1", "--text-length", "16", "--json", "--runs-dir", str(tmp_path / "runs")],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (result,) = json.loads(out.stdout)
    assert result["status"] == "ok", result["detail"]
    spec = json.loads((Path(result["run_dir"]) / "spec.json").read_text())
    assert spec["tokenizer"] == str(mine.resolve())


def test_bench_without_a_tokenizer_names_where_it_looked_in_one_line(tmp_path, edgebench_here):
    model, data = _checkpoint_and_data(tmp_path)
    (data / "tokenizer.json").unlink()
    out = edgebench_here("bench", "--model", str(model), "--data", str(data), "--methods", "sgd",
                         "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert (f"no tokenizer.json in {data.resolve()} or beside the model's config.json in {model.resolve()}; "
            "give --tokenizer PATH") in lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, names", [
    (["--model", "/no/such/checkpoint"], "--model"),
    (["--data", "DATA_WITHOUT_TOKENIZER"], "no tokenizer.json in"),
    (["--tokenizer", "DATA_WITHOUT_TOKENIZER"], "--tokenizer goes with --data"),
    (["--data", "PARQUET_WITHOUT_TEXTS"], "captions.parquet: no texts column (found images, caption)"),
    (["--backend", "onnxruntime", "--save", "trained"], "use --backend eager with --save"),
    (["--methods", "sgd,adamw-accum4", "--batch-size", "2"], "a multiple of 4 (got 2)"),
])
def test_bench_refuses_a_bad_model_or_dataset_folder_in_one_line(tmp_path, args, names, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("EDGEBENCH_CACHE", str(tmp_path / "cache"))
    bare, parquet = tmp_path / "data", tmp_path / "parquet"
    bare.mkdir()
    (bare / "data.jsonl").write_text("")
    parquet.mkdir()
    pq.write_table(pa.table({"images": [[{"bytes": b"x", "path": None}]], "caption": ["red"]}),
                   parquet / "captions.parquet")
    (parquet / "tokenizer.json").write_text("{}")
    args = [{"DATA_WITHOUT_TOKENIZER": str(bare), "PARQUET_WITHOUT_TEXTS": str(parquet)}.get(a, a) for a in args]
    result = CliRunner().invoke(bench, args + ["--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2 and names in " ".join(result.output.split()) and "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()  # refused before any run started


def test_bench_table_reads_at_80_columns_with_repeats_folded():
    def result(method, step_s, status="ok", disturbed=False):
        return {"method": method, "model": "tiny", "backend": "eager", "batch_size": 1, "status": status,
                "run_id": f"{method}-{step_s}", "peak_rss_bytes_kernel": 350 << 20,
                "predicted_peak_bytes_est": 300 << 20, "step_time_s": {"median": step_s},
                "samples_per_s": 1 / step_s, "loss_first": 5.0, "loss_last": 4.0,
                "cpu": {"others_share": 0.3 if disturbed else 0.01, "disturbed": disturbed,
                        "disturbed_why": "other processes used 30% of the CPU" if disturbed else None},
                "detail": "" if status == "ok" else "worker killed by SIGKILL"}
    console = Console(width=80, record=True, color_system=None)
    render_bench_results([result("adamw", 0.2), result("sgd", 0.1), result("adamw", 0.3, disturbed=True),
                          result("sgd", 0.12), result("mezo-lora+frozen-int8+ckpt", 0.5, "oom")],
                         "tiny on local, batch 1, eager", console=console)
    lines = console.export_text().splitlines()
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80 and "…" not in text
    assert "0.25 [0.2-0.3]" in text and "0.11 [0.1-0.12]" in text  # median [min-max] of the repeats
    assert "mezo-lora+frozen-int8+ckpt" in text.replace("\n", "")
    assert "ok !" in text and "1 of 5 runs, in 1 configuration marked !, were disturbed" in " ".join(lines)
    assert "samples/s" in text and "smp/s" not in text and "smpl" not in text
    names_beside_figures(lines, ["adamw", "sgd"])


def test_deploy_ships_a_folder_once_verified_by_sha256_and_cached(tmp_path):
    from edgebench.devices.inventory import get_device
    from edgebench.devices.transport import LocalTransport
    from edgebench.fleet import assets
    from edgebench.fleet.deploy import _ship_tar, _tar_dir

    folder = tmp_path / "my-vlm"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "sub" / "w.bin").write_bytes(os.urandom(4096))
    device, work, logs = get_device("local"), tmp_path / "device-workdir", []
    with LocalTransport(device) as transport:
        def ship(specs, ship_tar=_ship_tar):
            assets.ship_assets(transport, device, specs, str(work), tmp_path, ship_tar, _tar_dir, logs.append)

        first, second = RunSpec(checkpoint=str(folder), data_dir=str(folder)), RunSpec(checkpoint=str(folder))
        ship([first])
        remote = Path(first.checkpoint)
        assert first.data_dir == first.checkpoint and remote.parent == work / "cache"
        assert (remote / "sub" / "w.bin").read_bytes() == (folder / "sub" / "w.bin").read_bytes()
        shipped = sum("shipping" in line for line in logs)
        ship([second])  # a later sweep: found on the device, nothing shipped
        assert second.checkpoint == first.checkpoint and sum("shipping" in line for line in logs) == shipped
        assert "already on the device" in logs[-1]

        def damaging(transport, archive, remote):
            _ship_tar(transport, archive, remote)
            (Path(remote) / "config.json").write_text("{ }")  # a byte changed on the way

        (folder / "config.json").write_text('{"a": 1}')  # new content: a new cache entry
        with pytest.raises(assets.AssetError, match="config.json"):
            ship([RunSpec(checkpoint=str(folder))], ship_tar=damaging)
        assert len(list((work / "cache").iterdir())) == 1  # the damaged copy was removed


def test_deploy_ships_a_tokenizer_file_alone_verified_and_the_device_finds_the_same_one(tmp_path):
    """--tokenizer's file ships alone (not what lies beside it), sha256-verified, and the spec
    names the device's copy; without it, the one beside the checkpoint travels inside the
    checkpoint, the dataset ships without one, and the device's lookup finds the same file."""
    from edgebench.data.folder import FolderDataset
    from edgebench.devices.inventory import get_device
    from edgebench.devices.transport import LocalTransport
    from edgebench.fleet import assets
    from edgebench.fleet.deploy import _ship_tar, _tar_dir

    model, data = _checkpoint_and_data(tmp_path)
    mine = tmp_path / "downloads" / "my-tokenizer.json"
    mine.parent.mkdir()
    (data / "tokenizer.json").rename(mine)
    (mine.parent / "big.bin").write_bytes(os.urandom(4096))  # beside it, not ours to ship
    device, work, logs = get_device("local"), tmp_path / "device-workdir", []
    with LocalTransport(device) as transport:
        def ship(spec, ship_tar=_ship_tar):
            assets.ship_assets(transport, device, [spec], str(work), tmp_path, ship_tar, _tar_dir, logs.append)
            return spec

        given = ship(RunSpec(checkpoint=str(model), data_dir=str(data), tokenizer=str(mine)))
        shipped = Path(given.tokenizer)
        assert shipped.parent.parent == work / "cache" and [p.name for p in shipped.parent.iterdir()] == [mine.name]
        assert shipped.read_bytes() == mine.read_bytes() and f"shipping tokenizer {mine} (" in "\n".join(logs)
        assert FolderDataset(given.data_dir, given.tokenizer, checkpoint=given.checkpoint).tokenizer_path == shipped

        mine.rename(model / "tokenizer.json")
        beside = ship(RunSpec(checkpoint=str(model), data_dir=str(data)))
        assert beside.tokenizer is None and not (Path(beside.data_dir) / "tokenizer.json").exists()
        found = FolderDataset(beside.data_dir, checkpoint=beside.checkpoint).tokenizer_path
        assert found == Path(beside.checkpoint) / "tokenizer.json" and found.read_bytes() == shipped.read_bytes()

        def damaging(transport, archive, remote):
            _ship_tar(transport, archive, remote)
            (Path(remote) / "tokenizer.json").write_text("{ }")  # a byte changed on the way

        (mine.parent / "tokenizer.json").write_text('{"a": 1}')
        with pytest.raises(assets.AssetError, match="tokenizer.json"):
            ship(RunSpec(data_dir=str(data), tokenizer=str(mine.parent / "tokenizer.json")), ship_tar=damaging)


def test_library_chatter_is_silenced_in_every_process():
    """torchao's CUDA-kernel load failures and torch's pytree deprecations are not ours to print."""
    code = ("import edgebench, warnings, torchao.optim\n"
            "warnings.warn('`isinstance(treespec, LeafSpec)` is deprecated, use ...', FutureWarning)\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert (out.stdout, out.stderr) == ("ok\n", "")


def test_readme_your_model_your_data_example_runs_as_written(tmp_path):
    """README's "Your model, your data" block, run as it stands: a Hugging Face dataset, LoRA, --save,
    then the saved checkpoint loaded strictly, with peft's adapter files beside it."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Your model, your data", 1)[1].split("\n## ", 1)[0]
    script = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "EDGEBENCH_CACHE": str(tmp_path / "cache"), "XDG_DATA_HOME": str(tmp_path / "data")}
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (saved,) = (tmp_path / "trained").iterdir()
    assert {"config.json", "model.safetensors", "adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in saved.iterdir()}
    assert f"lora: trained weights saved to {saved}" in out.stdout
    # Piped, bench still shows where it is: one plain line per stage and step, with the elapsed time.
    for line in ("lora (eager): loading", "lora (eager): step 4/4", "lora (eager): ok"):
        assert re.search(r"^\[ +\d+\.\d s\] " + re.escape(line) + "$", out.stderr, re.M), out.stderr
    runs = tmp_path / "data" / "edgebench"  # the user's store and run directories (edgebench.results)
    spec = json.loads((runs / saved.name / "spec.json").read_text())
    assert Path(spec["data_dir"]).is_relative_to(tmp_path / "cache" / "datasets")  # converted once, by content
    result = figures_of_run_dir(runs / saved.name)
    assert result["status"] == "ok" and result["predicted_peak_bytes_est"] > 0


def test_rerun_disturbed_runs_a_disturbed_run_again_within_its_budget_and_keeps_both(tmp_path):
    """A process spins on a core for the whole sweep, so every run is disturbed (others take far
    more than 10% of the CPU): the first is run again once, as the budget allows, the
    re-run (disturbed too) is not, and both stay in the store, the re-run naming its first."""
    from edgebench.results.store import Store

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])]
    try:
        out = CliRunner().invoke(bench, ["--model", "tiny", "--methods", "sgd", "--steps", "2", "--warmup", "0",
                                         "--text-length", "16", "--runs-dir", str(tmp_path), "--rerun-disturbed", "1"],
                                 env={"COLUMNS": "200"})
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "--rerun-disturbed 1: 1 disturbed run re-run" in text
    assert "1 disturbed run not re-run: the 1 re-runs were spent" in text
    with Store(tmp_path / "edgebench.duckdb", read_only=True) as store:
        specs = {r["run_id"]: json.loads(r["meta_json"])["spec"] for r in store.runs()}
    (rerun,) = [run_id for run_id, spec in specs.items() if spec["extra"].get("rerun_of")]
    assert len(specs) == 2 and specs[rerun]["extra"]["rerun_of"] in set(specs) - {rerun}


def test_bench_table_shows_heldout_figures_and_the_target_only_where_runs_evaluated():
    def result(method, steps_to_target, seconds, eval_loss_last=None, target="loss=2.0"):
        learned = {} if eval_loss_last is None else {
            "eval_loss_first": 4.0, "eval_loss_last": eval_loss_last, "eval_accuracy_last": 0.25, "target": target,
            "target_reached": steps_to_target is not None, "steps_to_target": steps_to_target,
            "time_to_target_s": seconds}
        return {"method": method, "model": "tiny", "backend": "eager", "batch_size": 1, "status": "ok",
                "run_id": f"{method}-{steps_to_target}", "peak_rss_bytes_kernel": 350 << 20,
                "step_time_s": {"median": 0.1}, "samples_per_s": 10.0, "loss_first": 5.0, "loss_last": 4.0,
                **learned}

    def shown(results, width=200):
        console = Console(width=width, record=True, color_system=None)
        render_bench_results(results, "tiny on local, batch 1, eager", console=console)
        return console.export_text()

    text = shown([result("adamw", 4, 0.4, 1.9), result("adamw", 6, 0.6, 1.8), result("sgd", None, None, 2.6)])
    for header in ("held-out loss", "held-out acc", "reached", "steps to target", "s to target"):
        assert header in text, text
    adamw = next(line for line in text.splitlines() if line.lstrip().startswith("adamw"))
    assert adamw.split()[-6:] == ["25%", "2/2", "5", "[4-6]", "0.5", "[0.4-0.6]"], adamw
    sgd = next(line for line in text.splitlines() if line.lstrip().startswith("sgd"))
    assert sgd.split()[-3:] == ["0/1", "-", "-"] and "4->2.6 -35%" in sgd
    assert "held-out" not in shown([result("adamw", None, None)])  # no evaluation: no such columns
    narrow = shown([result("adamw", 4, 0.4, 1.9), result("adamw", 6, 0.6, 1.8)], width=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80 and "2/2" in narrow and "#1" not in narrow
