"""The arm64 emulation root: an arm64 Debian Python with the arm64 wheels a Pi or Jetson runs,
under qemu user-mode emulation, for lab devices started with `--arch arm64`.

Why: what breaks only on arm64 (a missing wheel, a CUDA-only torch, a .pte that does not load)
shows up here without hardware, binfmt_misc or containers. Built once per version set (`key()`)
into `$EDGEBENCH_CACHE/arm64/<key>/` (default ~/.cache/edgebench), never touching the host's dpkg:

  downloads/  the .debs and wheels; their sha256 in manifest.json, checked on every reuse
  tools/      qemu-aarch64 (static, qemu-user from bookworm-backports: Debian 12's 7.2 crashes
              `import torch`) and aarch64 binutils (x86 programs; they build the stubs below)
  root/       the arm64 sysroot (QEMU_LD_PREFIX): python3.11, libstdc++, libgomp, libatomic
  site/       the wheels unpacked, .pyc compiled on the host (same 3.11 bytecode)
  stubs/      PyPI's aarch64 torch is a CUDA build: stand-ins for the CUDA libraries it links,
              generated from its undefined symbols; their functions return an error (no device)
  bin/python  the device's python: a shell wrapper that runs qemu with argv[0] set to itself,
              so sys.executable re-enters the emulator (subprocess, multiprocessing spawn)
  manifest.json  versions, digests and the build's measured costs; written last (= built)
"""

from __future__ import annotations

import fcntl
import getpass
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgebench.cache import cache_dir as edgebench_cache
from edgebench.errors import EdgebenchError

DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
SUITE = "bookworm"  # glibc 2.36 and Python 3.11, as on Raspberry Pi OS bookworm
TOOLS = {"qemu-user": "bookworm-backports", "binutils-aarch64-linux-gnu": SUITE}
SYSROOT_DEBS = ("python3.11", "libstdc++6", "libgomp1", "libatomic1")
PYTHON = "3.11"
# The on-device dependencies at the host venv's versions: torch and executorch without theirs
# (CUDA libraries, export-time tools), then what the device side imports with them and the
# closure of their requirements for Linux aarch64 (peft for LoRA pulls transformers and
# huggingface_hub). Not onnxruntime-training: it has no Linux aarch64 wheel.
WHEELS = (
    "torch==2.13.0", "executorch==1.5.1", "numpy==2.4.6", "psutil==7.2.2", "peft==0.21.2", "torchao==0.18.0",
    "accelerate==1.15.0", "annotated-doc==0.0.7", "annotated-types==0.8.0", "anyio==4.16.0", "click==8.5.1",
    "filelock==4.3.1", "flatbuffers==25.12.19", "fsspec==2026.9.0", "h11==0.16.0", "hf-xet==1.8.0",
    "httpcore2==2.16.2", "httpx2==2.16.2", "huggingface-hub==2.4.0", "idna==3.20", "jinja2==3.1.6",
    "markdown-it-py==4.3.0", "markupsafe==3.0.4", "mdurl==0.1.2", "mpmath==1.3.0", "networkx==3.6.1",
    "packaging==26.4", "pydantic==2.14.4", "pydantic-core==2.50.5", "pygments==2.21.0", "pyyaml==6.0.4",
    "regex==2026.11.19", "rich==15.0.0", "ruamel-yaml==0.19.1", "safetensors==0.8.0", "shellingham==1.5.4",
    "sympy==1.14.0", "tabulate==0.10.0", "tokenizers==0.23.3", "tqdm==4.70.1", "transformers==5.24.0",
    "truststore==0.10.5", "typer==0.29.2", "typing-extensions==4.16.0", "typing-inspection==0.4.5",
)
PLATFORMS = ("manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64")
NO_DEVICE = 100  # what every stub function returns: cudaErrorNoDevice / CUDA_ERROR_NO_DEVICE
FIRST_BUILD = "about 5 min (285 s measured on a loaded 2-core host), 0.6 GB downloaded, 2.1 GB on disk"
STEPS = ("Debian index (amd64)", "qemu-user and aarch64 binutils", "Debian index (arm64)",
         "arm64 sysroot debs", "arm64 wheels (torch 430 MB)", "unpacking", "stub CUDA libraries",
         "compiling .pyc", "checking `import torch` under emulation")


class Arm64Error(EdgebenchError, RuntimeError):
    """The emulation root cannot be built or used; the message says what to do."""


def key() -> str:
    """Names the version set: what is downloaded and how it is put together."""
    spec = {"suite": SUITE, "tools": TOOLS, "debs": SYSROOT_DEBS, "python": PYTHON, "wheels": WHEELS,
            "platforms": PLATFORMS, "stub_return": NO_DEVICE, "layout": 1}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    return edgebench_cache("arm64", key()).resolve()


@dataclass
class Emulation:
    """A built root: the device's python and what the build recorded."""

    root: Path
    manifest: dict[str, Any]  # manifest.json as the build wrote it

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def emulator(self) -> str:
        return str(self.manifest["emulator"])


def status() -> dict[str, str]:
    """Whether the root is built here, and if not whether it can be: {"state": built | buildable
    | unavailable, "detail": ...}; "unavailable" names what is missing."""
    root = cache_dir()
    if (root / "manifest.json").exists():
        return {"state": "built", "detail": str(root)}
    missing = [tool for tool in ("apt-get", "dpkg-deb", "dpkg") if shutil.which(tool) is None]
    if missing:
        return {"state": "unavailable", "detail": f"{', '.join(missing)} not found: the arm64 lab builds its root "
                "with Debian's apt (a Debian or Ubuntu host)"}
    if not Path(DEBIAN_KEYRING).exists():
        return {
            "state": "unavailable",
            "detail": f"{DEBIAN_KEYRING} missing: `apt-get install -y debian-archive-keyring`",
        }
    return {"state": "buildable", "detail": f"first build: {FIRST_BUILD} into {root}"}


def ensure(step: Callable[[int, str], None] = lambda i, what: None) -> Emulation:
    """The built root, building it first if needed (`step(i, what)` hears each of STEPS).

    Reuse checks every download's sha256 against the manifest. Concurrent callers wait for one build.
    """
    root = cache_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "manifest.json").exists():
            state = status()
            if state["state"] == "unavailable":
                raise Arm64Error(f"arm64 lab: {state['detail']}")
            _build(root, step)
        manifest = json.loads((root / "manifest.json").read_text())
        verify(root, manifest)
    return Emulation(root, manifest)


def verify(root: Path, manifest: dict[str, Any]) -> None:
    """Every downloaded file still has the digest recorded when it was downloaded."""
    for rel, digest in manifest["sha256"].items():
        path = root / rel
        if not path.exists() or _sha256(path) != digest:
            raise Arm64Error(f"arm64 lab: {path} is missing or changed (sha256 differs from the build's record); "
                             f"remove {root} and run `edgebench lab up --arch arm64` again to rebuild it")


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _run(argv: list[str], what: str, fix: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        raise Arm64Error(
            f"arm64 lab: {what} failed ({(lines or [f'exit {proc.returncode}'])[-1].strip()[:300]}); {fix}"
        )
    return proc.stdout


def _apt(work: Path, arch: str, suites: list[str]) -> dict[str, str]:
    """A private APT configuration (own lists, cache and empty dpkg status): the host's dpkg is never touched."""
    base = work / f"apt-{arch}"
    for sub in ("state/lists/partial", "cache/archives/partial", "etc/sources.list.d", "etc/preferences.d",
                "etc/apt.conf.d"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "state/status").touch()
    mirror = os.environ.get("EDGEBENCH_DEBIAN_MIRROR", DEBIAN_MIRROR)
    (base / "etc/sources.list").write_text(
        "".join(f"deb [signed-by={DEBIAN_KEYRING}] {mirror} {s} main\n" for s in suites)
    )
    conf = {"APT::Architecture": arch, "Dir::State": base / "state", "Dir::State::status": base / "state/status",
            "Dir::Cache": base / "cache", "Dir::Etc::SourceList": base / "etc/sources.list",
            "Dir::Etc::SourceParts": base / "etc/sources.list.d", "Dir::Etc::Preferences": base / "etc/preferences",
            "Dir::Etc::PreferencesParts": base / "etc/preferences.d", "Dir::Etc::Parts": base / "etc/apt.conf.d",
            "Acquire::Languages": "none", "APT::Sandbox::User": getpass.getuser()}
    lines = [f'{k} "{v}";' for k, v in conf.items()] + [f'APT::Architectures {{ "{arch}"; }};']
    (base / "apt.conf").write_text("\n".join(lines) + "\n")
    return {**os.environ, "APT_CONFIG": str(base / "apt.conf"), "DEBIAN_FRONTEND": "noninteractive"}


def _apt_update(env: dict[str, str], arch: str) -> None:
    mirror = os.environ.get("EDGEBENCH_DEBIAN_MIRROR", DEBIAN_MIRROR)
    _run(["apt-get", "update", "-q"], f"reading Debian's {arch} package index from {mirror}",
         f"check access to {mirror} (or set EDGEBENCH_DEBIAN_MIRROR to a Debian mirror), then run again", env)


def _download_tools(downloads: Path, env: dict[str, str]) -> None:
    for package, suite in TOOLS.items():
        _run(["apt-get", "download", "-q", f"{package}/{suite}"], f"downloading {package} ({suite}, amd64)",
             f"check access to the Debian mirror; `{package}` must exist in {suite}, then run again", env, downloads)


def _download_sysroot(downloads: Path, env: dict[str, str]) -> list[Path]:
    _run(["apt-get", "install", "-q", "-d", "-y", "--no-install-recommends", *SYSROOT_DEBS],
         f"downloading the arm64 debs {', '.join(SYSROOT_DEBS)} and their dependencies",
         "check access to the Debian mirror, then run again", env)
    archives = Path(env["APT_CONFIG"]).parent / "cache/archives"
    debs = sorted(archives.glob("*.deb"))
    for deb in debs:
        shutil.move(deb, downloads / deb.name)
    return [downloads / d.name for d in debs]


def _download_wheels(downloads: Path) -> None:
    argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps", "-d", str(downloads),
            "--python-version", PYTHON, "--implementation", "cp", "--abi", f"cp{PYTHON.replace('.', '')}",
            "--abi", "abi3", "--abi", "none", *[a for p in PLATFORMS for a in ("--platform", p)], *WHEELS]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        failed = re.findall(r"No matching distribution found for (\S+)", proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()[-1:]
        what = f"the aarch64 wheel of {failed[0]}" if failed else f"the aarch64 wheels ({(lines or ['?'])[-1][:200]})"
        raise Arm64Error(f"arm64 lab: could not download {what} from PyPI; check access to pypi.org (or set "
                         "PIP_INDEX_URL to a PyPI mirror), then run `edgebench lab up --arch arm64` again")


def aarch64_executorch() -> Path:
    """The aarch64 executorch package (include/, lib/, share/cmake: its C++ runtime) the native
    worker is cross-built against: the emulation root's copy when that is built, else the
    wheel alone, downloaded once into the cache (no torch, no sysroot)."""
    if (cache_dir() / "manifest.json").exists() and (cache_dir() / "site" / "executorch" / "lib").is_dir():
        return cache_dir() / "site" / "executorch"
    wheel = next(w for w in WHEELS if w.startswith("executorch=="))
    target = cache_dir().parent / f"aarch64-{wheel.replace('==', '-')}"
    if (target / "executorch" / "share").is_dir():
        return target / "executorch"
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".aarch64-executorch-", dir=target.parent))
    try:
        argv = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps", "-d", str(work),
                "--python-version", PYTHON, "--implementation", "cp", "--abi", f"cp{PYTHON.replace('.', '')}",
                *[a for p in PLATFORMS for a in ("--platform", p)], wheel]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise Arm64Error(
                f"could not download the aarch64 wheel of {wheel} from PyPI ({proc.stderr.strip()[-300:]}); "
                "check access to pypi.org (or PIP_INDEX_URL), then run again"
            )
        (downloaded,) = work.glob("*.whl")
        with zipfile.ZipFile(downloaded) as archive:
            for info in archive.infolist():
                if info.filename.startswith(("executorch/include/", "executorch/lib/", "executorch/share/")):
                    archive.extract(info, work / "unpacked")
                    mode = info.external_attr >> 16
                    if mode:
                        os.chmod(work / "unpacked" / info.filename, mode & 0o777)
        os.replace(work / "unpacked", target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target / "executorch"


def _unpack(work: Path, downloads: Path, sysroot_debs: list[Path]) -> None:
    tools, sysroot, site = work / "tools", work / "root", work / "site"
    for path in (tools, sysroot, site):
        path.mkdir(exist_ok=True)
    for deb in sorted(downloads.glob("binutils-*_amd64.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(tools)], f"unpacking {deb.name}", f"remove {work} and run again")
    for deb in sorted(downloads.glob("qemu-user_*_amd64.deb")):  # only qemu-aarch64 of its 30 emulators
        with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc, \
                tarfile.open(fileobj=proc.stdout, mode="r|") as archive:
            for member in archive:
                if member.name == "./usr/bin/qemu-aarch64":
                    archive.extract(member, tools, filter="tar")
    if not (tools / "usr/bin/qemu-aarch64").exists():
        raise Arm64Error(f"arm64 lab: no usr/bin/qemu-aarch64 in the qemu-user package; remove {work} and run again")
    for deb in sysroot_debs:
        _run(["dpkg-deb", "-x", str(deb), str(sysroot)], f"unpacking {deb.name}", f"remove {work} and run again")
    for wheel in sorted(downloads.glob("*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
            for info in archive.infolist():  # zipfile drops the executable bits
                mode = info.external_attr >> 16
                if mode & 0o111:
                    os.chmod(site / info.filename, mode & 0o777)


def _binutils(tools: Path) -> Callable[..., str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(tools / "usr/lib/x86_64-linux-gnu")}

    def tool(name: str, *args: str) -> str:
        return _run([str(tools / f"usr/bin/aarch64-linux-gnu-{name}"), *args], f"aarch64-linux-gnu-{name}",
                    "install binutils-aarch64-linux-gnu's dependencies (`apt-get install -y binutils`), then run again",
                    env)
    return tool


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def _stubs(work: Path) -> list[str]:
    """Stand-ins for the shared libraries the wheels link but nothing provides (torch's CUDA
    libraries): each defines the symbols referenced from it (versioned ones under their version;
    unversioned ones no present library defines), functions returning NO_DEVICE."""
    tool = _binutils(work / "tools")
    site, sysroot, out = work / "site", work / "root", work / "stubs"
    elfs = [p for p in site.rglob("*.so*") if p.is_file() and _is_elf(p)]
    system = [p for d in ("lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu") for p in (sysroot / d).glob("*.so*")
              if p.is_file() and _is_elf(p)]
    provided = {p.name for p in elfs + system}

    def dynsyms(path: Path) -> list[list[str]]:
        rows = [ln.split() for ln in tool("readelf", "-W", "--dyn-syms", str(path)).splitlines()]
        return [r for r in rows if len(r) >= 8 and r[0].endswith(":") and r[0][:-1].isdigit()]

    symbols = {p: dynsyms(p) for p in elfs}
    defined = {r[7].split("@")[0] for rows in symbols.values() for r in rows if r[6] != "UND"}
    defined |= {r[7].split("@")[0] for p in system for r in dynsyms(p) if r[6] != "UND"}
    wanted: dict[str, dict[str, dict[str, str]]] = {}  # library -> version ("" none) -> symbol -> type
    for path in elfs:
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", tool("readelf", "-W", "-d", str(path)))
        missing = [n for n in needed if n not in provided]
        if not missing:
            continue
        versions: dict[str, str] = {}  # version name -> the library it is needed from
        current = None
        for line in tool("readelf", "-W", "-V", str(path)).splitlines():
            if found := re.search(r"File: (\S+)", line):
                current = found.group(1)
            elif (found := re.search(r"Name: (\S+)", line)) and current:
                versions[found.group(1)] = current
        unversioned = [n for n in missing if n not in versions.values()]
        for lib in missing:
            wanted.setdefault(lib, {})
        for row in symbols[path]:
            if row[6] != "UND" or row[4] == "WEAK":
                continue
            name, _, version = row[7].partition("@")
            version = version.split()[0] if version else ""
            if version and versions.get(version) in missing:
                wanted[versions[version]].setdefault(version, {})[name] = row[3]
            elif not version and name not in defined:
                for lib in unversioned:
                    wanted[lib].setdefault("", {})[name] = row[3]
    out.mkdir(exist_ok=True)
    for lib, by_version in sorted(wanted.items()):
        asm, script = [".text"], []
        for version, syms in by_version.items():
            for name, kind in sorted(syms.items()):
                if kind == "OBJECT":
                    asm += [".data", f'.globl "{name}"', f'.type "{name}", %object', f'.size "{name}", 8',
                            f'"{name}": .quad 0', ".text"]
                else:
                    asm += [f'.globl "{name}"', f'.type "{name}", %function', f'"{name}": mov w0, #{NO_DEVICE}', "ret"]
            if version:
                script.append(f"{version} {{ global: " + " ".join(f'"{n}";' for n in sorted(syms)) + " };")
        source, obj, vscript = out / f"{lib}.s", out / f"{lib}.o", out / f"{lib}.map"
        source.write_text("\n".join(asm) + "\n")
        tool("as", "-o", str(obj), str(source))
        args = ["-shared", "-soname", lib, "-o", str(out / lib), str(obj)]
        if script:
            vscript.write_text("\n".join(script) + "\n")
            args[:0] = ["--version-script", str(vscript)]
        tool("ld", *args)
        for tmp in (source, obj, vscript):
            tmp.unlink(missing_ok=True)
    return sorted(wanted)


def _compile(work: Path) -> None:
    """.pyc on the host: `import torch` under emulation takes ~15 s of CPU instead of ~25."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # Some files are templates or Python 2 (jinja2 tests, sympy's): compileall reports them and goes on.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-q", "-j", "0", str(work / "site"),
                    str(work / f"root/usr/lib/python{PYTHON}")], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def _wrapper(work: Path, final: Path, emulator: str) -> None:
    (work / "bin").mkdir(exist_ok=True)
    python = work / "bin/python"
    python.write_text(f"""#!/bin/sh
# edgebench arm64 lab: this device's python is an arm64 Python run by qemu user-mode emulation
# ({emulator}). qemu -0 gives Python this script as argv[0], so sys.executable re-enters here.
R={final}
export QEMU_LD_PREFIX="$R/root" EDGEBENCH_EMULATOR="{emulator}" OMP_NUM_THREADS="${{OMP_NUM_THREADS:-1}}"
export LD_LIBRARY_PATH="$R/stubs" PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}$R/site" PYTHONNOUSERSITE=1
exec "$R/tools/usr/bin/qemu-aarch64" -0 "$0" "$R/root/usr/bin/python{PYTHON}" "$@"
""")
    python.chmod(0o755)


def _du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _build(final: Path, step: Callable[[int, str], None]) -> None:
    """Builds into a fresh folder beside `final` and renames it: a failed build leaves nothing half-made."""
    started = time.monotonic()
    work = final.with_name(f"{final.name}.building")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(final, ignore_errors=True)
    downloads = work / "downloads"
    downloads.mkdir(parents=True)
    step(0, STEPS[0])
    amd64 = _apt(work, "amd64", [SUITE, "bookworm-backports"])
    _apt_update(amd64, "amd64")
    step(1, STEPS[1])
    _download_tools(downloads, amd64)
    step(2, STEPS[2])
    arm64 = _apt(work, "arm64", [SUITE])
    _apt_update(arm64, "arm64")
    step(3, STEPS[3])
    sysroot_debs = _download_sysroot(downloads, arm64)
    step(4, STEPS[4])
    _download_wheels(downloads)
    step(5, STEPS[5])
    for apt_dir in work.glob("apt-*"):
        shutil.rmtree(apt_dir)  # package indexes: 300 MB, not needed once downloaded
    _unpack(work, downloads, sysroot_debs)
    step(6, STEPS[6])
    stubs = _stubs(work)
    step(7, STEPS[7])
    _compile(work)
    qemu_version = _run([str(work / "tools/usr/bin/qemu-aarch64"), "--version"], "qemu-aarch64 --version",
                        f"remove {work} and run again").splitlines()[0]
    emulator = f"qemu-user {qemu_version.split('version ')[-1].split()[0]}"
    _wrapper(work, final, emulator)
    os.rename(work, final)  # the wrapper names its final path; nothing runs from `work`
    try:
        step(8, STEPS[8])
        probe = ("import time; t = time.monotonic(); import torch, platform, resource; print(platform.machine(), "
                 "torch.__version__, torch.cuda.is_available(), round(time.monotonic() - t, 1), "
                 "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
        out = _run([str(final / "bin/python"), "-c", probe], "`import torch` under emulation",
                   f"see the error above; remove {final} and run again").split()
        if out[:1] != ["aarch64"] or out[2] != "False":
            raise Arm64Error(f"arm64 lab: the emulated python reports {' '.join(out)}, not an aarch64 torch without "
                             f"CUDA; remove {final} and run again")
        manifest = {
            "key": key(), "emulator": emulator, "qemu": qemu_version, "python": PYTHON, "torch": out[1],
            "wheels": sorted(p.name for p in (final / "downloads").glob("*.whl")),
            "debs": sorted(p.name for p in (final / "downloads").glob("*.deb")),
            "stubs": stubs,
            "sha256": {str(p.relative_to(final)): _sha256(p) for p in sorted((final / "downloads").iterdir())},
            "import_torch_s": float(out[3]), "import_torch_maxrss_bytes": int(out[4]),
            "build_s": round(time.monotonic() - started, 1), "disk_bytes": _du(final),
            "downloaded_bytes": _du(final / "downloads"),
        }
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)
        raise
    tmp = final / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, final / "manifest.json")
