"""Builds the native worker bundle for a device's arch, on the host, cached by content.

x86_64: the host's compiler against this environment's executorch wheel (its CMake package).
aarch64: Debian's cross compiler (g++-aarch64-linux-gnu) against the aarch64 executorch
wheel, the one the arm64 lab downloads (or `pip download`s here). A bundle is the worker,
its libraries in lib/ (found through the worker's $ORIGIN/lib rpath) and bundle.json; its
key hashes the sources, the wheel's version and the arch, so an edit rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from edgebench.cache import cache_dir
from edgebench.errors import EdgebenchError
from edgebench.runner.native import BUNDLE_FACTS, LAUNCHER, WORKER, machine_arch

SOURCES = Path(__file__).resolve().parent
SOURCE_FILES = ("CMakeLists.txt", "worker.cpp", "run.sh")
LIBRARIES = ("libexecutorch.so", "libexecutorch_kernels_optimized.so", "libexecutorch_backend_xnnpack.so",
             "libexecutorch_threadpool.so")
ARCHES = ("x86_64", "aarch64")
CROSS_COMPILER = {"aarch64": "aarch64-linux-gnu-g++"}
# A cross-built bundle carries the C and C++ runtime it was linked against (Debian's cross
# toolchain: glibc 2.36), started through its own loader (run.sh): a board with an older glibc
# and Android's shell user (no glibc at all) run it as it is.
CROSS_RUNTIME = {"aarch64": ("/usr/aarch64-linux-gnu/lib", ("ld-linux-aarch64.so.1", "libc.so.6", "libm.so.6",
                                                           "libdl.so.2", "libpthread.so.0", "libgcc_s.so.1",
                                                           "libstdc++.so.6"))}


class NativeBuildError(EdgebenchError, RuntimeError):
    """The worker cannot be built here; the message names what is missing and how to get it."""


def cache_root() -> Path:
    return cache_dir("native")


def executorch_package(arch: str) -> Path:
    """The executorch package folder (include/, lib/, share/cmake) for `arch`."""
    if arch == machine_arch():
        import importlib.util

        found = importlib.util.find_spec("executorch")
        if found is None or not found.submodule_search_locations:
            raise NativeBuildError("executorch is not installed here: `pip install executorch==1.5.1` "
                                   "(bash scripts/setup.sh installs it)")
        return Path(next(iter(found.submodule_search_locations)))
    if arch == "aarch64":
        from edgebench.devices.arm64 import Arm64Error, aarch64_executorch

        try:
            return aarch64_executorch()
        except Arm64Error as exc:
            raise NativeBuildError(str(exc)) from None
    raise NativeBuildError(f"no native worker for {arch}: it is built for {', '.join(ARCHES)}")


def bundle_key(arch: str) -> str:
    digest = hashlib.sha256(arch.encode())
    digest.update(metadata.version("executorch").encode())
    for name in SOURCE_FILES:
        digest.update((SOURCES / name).read_bytes())
    return digest.hexdigest()[:16]


def cmake() -> str:
    """CMake >= 3.28 (executorch's package needs it): the one in this environment (PyPI's)."""
    here = Path(sys.executable).parent / "cmake"
    found = str(here) if here.exists() else shutil.which("cmake")
    if not found:
        raise NativeBuildError("cmake not found: `pip install 'cmake>=3.28'` (bash scripts/setup.sh installs it)")
    return found


def _configure_args(arch: str, package: Path) -> list[str]:
    args = [f"-DCMAKE_PREFIX_PATH={package}", "-DCMAKE_BUILD_TYPE=Release"]
    if arch != machine_arch():
        compiler = CROSS_COMPILER[arch]
        if shutil.which(compiler) is None:
            raise NativeBuildError(f"{compiler} not found: `apt-get install g++-aarch64-linux-gnu` (Debian's cross "
                                   "compiler; bash scripts/setup.sh installs it as root)")
        args += ["-DCMAKE_SYSTEM_NAME=Linux", f"-DCMAKE_SYSTEM_PROCESSOR={arch}", f"-DCMAKE_CXX_COMPILER={compiler}",
                 f"-DCMAKE_FIND_ROOT_PATH={package}", "-DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=BOTH"]
    return args


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def bundle(arch: str | None = None, log: Callable[[str], None] = lambda _: None) -> Path:
    """The worker bundle for `arch` (default: this host's), built once per content."""
    from exporters.pipeline import build_whole, locked

    arch = machine_arch(arch)
    if arch not in ARCHES:
        raise NativeBuildError(f"no native worker for {arch}: it is built for {', '.join(ARCHES)}")
    entry = cache_root() / f"{arch}-{bundle_key(arch)}"
    with locked(entry):
        if not (entry / BUNDLE_FACTS).is_file():
            build_whole(entry, lambda work: _build(arch, work, log))
    return entry


def _build(arch: str, work: Path, log: Callable[[str], None]) -> None:
    package = executorch_package(arch)
    build = work / "build"
    log(f"native worker: building for {arch} against {package}")
    for step in ([cmake(), "-S", str(SOURCES), "-B", str(build), *_configure_args(arch, package)],
                 [cmake(), "--build", str(build), "-j", "2"]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise NativeBuildError(f"building the native worker for {arch} failed ({' '.join(step[:2])}):\n{tail}")
    (work / "lib").mkdir()
    shutil.copy2(build / WORKER, work / WORKER)
    shutil.copy2(SOURCES / "run.sh", work / LAUNCHER)
    for name in LIBRARIES:
        shutil.copy2(package / "lib" / name, work / "lib" / name)
    if arch != machine_arch():
        folder, names = CROSS_RUNTIME[arch]
        for name in names:
            shutil.copy2(Path(folder, name).resolve(), work / "lib" / name)
    shutil.rmtree(build)
    files = {str(p.relative_to(work)): _sha256(p) for p in sorted(work.rglob("*")) if p.is_file()}
    facts = {"arch": arch, "executorch": metadata.version("executorch"), "key": work.name, "files": files}
    (work / BUNDLE_FACTS).write_text(json.dumps(facts, indent=1, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    """`python -m edgebench.native.build [ARCH ...]`: builds (or finds) the bundles, prints their folders."""
    for arch in (argv if argv is not None else sys.argv[1:]) or [machine_arch()]:
        try:
            print(bundle(arch, log=lambda line: print(line, file=sys.stderr)))
        except NativeBuildError as exc:
            print(f"native worker: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
