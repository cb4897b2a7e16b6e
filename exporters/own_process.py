"""Each export runs in a process of its own, forked from a server that has done nothing but
import the exporters (multiprocessing's forkserver):

- no replacement of upstream internals (exporters.upstream) is ever live in a process that
  does anything else, and two exports (deploy's devices, test workers) never share one;
- whatever a lowering leaves behind goes with its process (ExecuTorch's `is_same_node`
  lru_cache kept every graph it compared, ~1 GiB a nanoVLM-222M export: 22 exports in one
  process reached 24 GiB and the kernel's OOM kill);
- the fork costs milliseconds where a fresh interpreter would import torch and ExecuTorch
  again (~5 s here) for every export.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from edgebench.errors import EdgebenchError

# What the server imports once; each export's process starts with them imported, and unpatched.
PRELOAD = ["edgebench", "torch", "executorch.exir", "onnxruntime", "exporters.pipeline", "exporters.executorch"]

T = TypeVar("T")
Stage = Callable[[str], None]


PROCESS_NAME = "edgebench-export"


class ExportProcessDied(EdgebenchError):
    """The export's process ended without a result (killed: most often out of memory)."""


class ExportAtImport(EdgebenchError, RuntimeError):
    """An export asked for inside an export's own process: the forkserver imports the caller's
    main module there, and a script that exports at its top level would export again, waiting
    for the cache entry its parent holds, forever."""


def refuse_inside_export_process() -> None:
    """Called before an export takes its cache lock: an error naming the fix, not a deadlock."""
    if multiprocessing.current_process().name == PROCESS_NAME:
        raise ExportAtImport(
            "an export was started while the export's own process imported your script: put the "
            "script's top-level code under `if __name__ == \"__main__\":` (multiprocessing's "
            "forkserver imports the main module in every process it starts)")


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def in_own_process(function: Callable[..., T], *args: Any, on_stage: Stage = lambda stage: None) -> T:
    """`function(*args, on_stage=...)` in a process of its own: its stages reach `on_stage`
    here as they happen, its result or its exception is returned or raised here. `function`
    and its arguments are pickled (a module-level function, plain values)."""
    context = _context()
    receive, send = context.Pipe(duplex=False)
    # the server was started with the environment of its first use: each export gets today's
    process = context.Process(target=_run, args=(send, dict(os.environ), function, args), name=PROCESS_NAME,
                              daemon=True)
    process.start()
    send.close()
    try:
        while True:
            try:
                kind, value = receive.recv()
            except EOFError:
                process.join()
                raise ExportProcessDied(_died(process.exitcode)) from None
            if kind == "stage":
                on_stage(value)
            elif kind == "result":
                return value  # type: ignore[no-any-return]
            else:
                raise value
    finally:
        receive.close()
        if process.is_alive():  # Ctrl-C or an error here: the export stops with its caller
            process.terminate()
        process.join()


def _died(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        why = " (the kernel's OOM killer sends it: the host ran out of memory)" if name == "SIGKILL" else ""
        return f"the export's process was killed by {name}{why}; nothing was written to the export cache"
    return f"the export's process exited with code {exitcode} before its result; nothing was written to the cache"


def _run(send: Connection, environ: dict[str, str], function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    os.environ.clear()
    os.environ.update(environ)
    _thread_lock_for_tqdm()
    try:
        result = function(*args, on_stage=lambda stage: send.send(("stage", stage)))
        send.send(("result", result))
    except BaseException as error:  # noqa: B036 - every ending reaches the caller, Ctrl-C included
        send.send(("error", _portable(error)))
    finally:
        send.close()


def _thread_lock_for_tqdm() -> None:
    """torch.fx's progress bars (tqdm) take a multiprocessing lock by default: a named semaphore
    this short-lived process would leave to the resource tracker, which then warned about a
    "leaked semaphore" after every export. A thread lock serves one process as well."""
    try:
        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def _portable(error: BaseException) -> BaseException:
    """`error` as it can cross to the caller: itself (a bug with the export process's traceback
    as a note), or, where it cannot be pickled, a RuntimeError that says what it was."""
    where = "".join(traceback.format_exception(error))
    try:
        if not isinstance(error, EdgebenchError):  # a user's error says all in its message
            error.add_note(f"in the export's process:\n{where}")
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"in the export's process:\n{where}")
