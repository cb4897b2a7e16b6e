"""Each export runs in a process of its own (exporters.own_process): its replacements of upstream
internals are never live in the caller, results and errors cross back, a killed export is said
as such, and two exports at once run in two processes at once."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from edgebench.errors import EdgebenchError
from exporters.own_process import ExportAtImport, ExportProcessDied, in_own_process


class UsersMistake(EdgebenchError):
    pass


def _pid(on_stage) -> int:
    on_stage("started")
    return os.getpid()


def _refuse(on_stage) -> None:
    raise UsersMistake("profile field export.dtype: use float32")


def _bug(on_stage) -> None:
    return 1 // 0


def _killed(on_stage) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _meet(mine: str, theirs: str, folder: Path, on_stage) -> int:
    """Waits for the other export's mark: returns only if both run at the same time."""
    (folder / mine).touch()
    deadline = time.monotonic() + 120
    while not (folder / theirs).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{theirs} never ran beside {mine}")
        time.sleep(0.01)
    return os.getpid()


def test_results_stages_and_errors_cross_back():
    stages: list[str] = []
    assert in_own_process(_pid, on_stage=stages.append) != os.getpid() and stages == ["started"]
    with pytest.raises(UsersMistake, match="export.dtype: use float32"):
        in_own_process(_refuse)
    with pytest.raises(ZeroDivisionError) as bug:
        in_own_process(_bug)
    assert "in _bug" in "".join(bug.value.__notes__)  # the export process's traceback, for the report
    with pytest.raises(ExportProcessDied, match="killed by SIGKILL"):
        in_own_process(_killed)


def test_two_exports_at_once_run_in_two_processes(tmp_path):
    pids: dict[str, int] = {}

    def export(mine: str, theirs: str) -> None:
        pids[mine] = in_own_process(_meet, mine, theirs, tmp_path)

    threads = [threading.Thread(target=export, args=pair) for pair in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()


def test_bench_and_deploy_export_in_their_own_process_and_say_when_a_cached_program_was_replaced(tmp_path,
                                                                                                   monkeypatch):
    """The export step of bench and deploy (export_for_spec), for real: at every stage (reported
    while the lowering runs) every registered upstream attribute in this process is upstream's
    own, and ExecuTorch's node comparison cache (an lru_cache without a size that keeps every
    graph it compared) holds nothing new here; a damaged cached file is exported again and named
    through the progress, as `edgebench export` names it."""
    from executorch.exir.backend.utils import is_same_node

    from edgebench.runner.spec import RunSpec
    from exporters import upstream
    from exporters.pipeline import export_for_spec

    monkeypatch.setenv("EDGEBENCH_EXPORT_CACHE", str(tmp_path / "cache"))
    stages: list[str] = []

    def stage(name: str) -> None:
        assert not upstream._LIVE, f"a replacement is live here during {name!r}"
        for target, entry in upstream.REPLACEMENTS.items():
            assert upstream.fingerprint(upstream.resolve(target)) == entry.fingerprint, \
                f"{target} is replaced here during {name!r}"
        stages.append(name)

    compared = is_same_node.cache_info().currsize
    spec = RunSpec(model="tiny", method="sgd", backend="executorch")
    program = Path(export_for_spec(spec, on_stage=stage))
    assert "build model" in stages and len(stages) >= 3 and is_same_node.cache_info().currsize == compared
    (program / "model.pte").write_bytes(b"")  # a damaged cache entry
    stages.clear()
    assert Path(export_for_spec(spec, on_stage=stage)) == program
    assert "build model" in stages  # exported again
    assert f"{program / 'model.pte'}: not the file the export wrote (its sha256 differs); replaced" in stages


def _export_again(on_stage) -> None:
    from exporters.manifest import ExportRequest
    from exporters.pipeline import export

    export(ExportRequest(model="micro", method="sgd", backend="onnxruntime", text_length=12))


def test_an_export_inside_an_exports_process_is_refused_before_it_takes_a_lock():
    with pytest.raises(ExportAtImport, match='if __name__ == "__main__":'):
        in_own_process(_export_again)


@pytest.mark.large  # a fresh interpreter and the export server's start: ~15 s
def test_a_script_that_exports_at_its_top_level_is_told_to_guard_it_not_left_waiting(tmp_path):
    """The forkserver imports the calling script in the export's process; unguarded, its
    top-level export asked again for the cache entry its parent holds (a hang before)."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text("from exporters.manifest import ExportRequest\nfrom exporters.pipeline import export\n"
                      "export(ExportRequest(model='micro', method='sgd', backend='onnxruntime', text_length=12))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "EDGEBENCH_EXPORT_CACHE": str(tmp_path / "cache")})
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr, done.stderr[-3000:]
    assert "ExportProcessDied" in done.stderr  # the caller ends too, with nothing cached
