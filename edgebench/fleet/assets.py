"""A user's checkpoint and dataset folders (and the native worker with its plans), shipped to
a device once; a Hugging Face dataset is first turned into the folder format, once per content.

Each folder is content-addressed: the sha256 of every file, and of that list. It lands
in `<workdir>/cache/<digest>-<name>/`, is checked file by file on the device after
unpacking (fleet/device_scripts/digests.py), and only then marked verified; a later
sweep that needs the same content finds the mark and ships nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, Callable

from edgebench.fleet.device_scripts import digests as digests_script
from edgebench.fleet.device_scripts.digests import digests
from edgebench.fleet.remote import run_program

MARKER = ".edgebench-verified"


class AssetError(RuntimeError):
    """A folder arrived different from what was sent."""


def folder_digest(folder: Path) -> tuple[str, dict[str, str]]:
    """(digest of the whole folder, sha256 per file)."""
    files = digests(str(folder))
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(), files


def as_folder_dataset(folder: Path) -> Path:
    """A Hugging Face dataset folder as a folder dataset, converted once per content into
    `$EDGEBENCH_CACHE/datasets/<sha256>/<name>` (the device reads only the folder format);
    any other folder as it is."""
    from edgebench.data import hf

    if not hf.is_hf_dataset(folder):
        return folder
    digest, _ = folder_digest(folder)
    cache = Path(os.environ.get("EDGEBENCH_CACHE") or "~/.cache/edgebench").expanduser()
    out = cache / "datasets" / digest[:24] / folder.name
    if not (out / "data.jsonl").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        hf.convert(folder, out)
    return out


def ship_folder(transport: Any, device: Any, local: Path, workdir: str, staging: Path,
                ship_tar: Callable[[Any, Path, str], None], tar_dir: Callable[..., Path],
                log: Callable[[str], None] = lambda _: None) -> str:
    """The device path of `local`'s content, shipped and verified unless already cached there."""
    digest, files = folder_digest(local)
    remote = f"{workdir}/cache/{digest[:24]}-{re.sub(r'[^A-Za-z0-9._-]+', '_', local.name)}"
    if transport.run(["test", "-f", f"{remote}/{MARKER}"]).rc == 0:
        log(f"{device.name}: {local} already on the device ({remote}, sha256 verified before)")
        return remote
    archive = tar_dir(local, ".", staging / f"asset-{digest[:12]}.tar", compress=False)
    log(f"{device.name}: shipping {local} ({archive.stat().st_size / 2**20:.1f} MiB) to {remote}")
    transport.check(["rm", "-rf", remote])
    ship_tar(transport, archive, remote)
    got = run_program(transport, device, digests_script, remote)
    if got != files:
        bad = sorted(k for k in set(files) | set(got) if files.get(k) != got.get(k))
        transport.check(["rm", "-rf", remote])
        raise AssetError(f"{device.name}: {local} arrived different from what was sent ({', '.join(bad[:5])}); "
                         "check the device's free disk space and run deploy again")
    transport.check(["sh", "-c", f"echo {digest} > {shlex.quote(remote + '/' + MARKER)}"])
    return remote


def ship_assets(transport: Any, device: Any, specs: list[Any], workdir: str, staging: Path,
                ship_tar: Callable[[Any, Path, str], None], tar_dir: Callable[..., Path],
                log: Callable[[str], None] = lambda _: None) -> None:
    """Ships every checkpoint and dataset folder, native worker bundle and native plan the
    specs name (once each) and points the specs at the device's copies."""
    for attr in ("checkpoint", "data_dir", "native_worker", "native_plan"):
        for local in dict.fromkeys(getattr(s, attr) for s in specs if getattr(s, attr)):
            if not Path(local).is_dir():
                continue  # already a device path (e.g. a spec file written for that device)
            remote = ship_folder(transport, device, Path(local), workdir, staging, ship_tar, tar_dir, log)
            for spec in specs:
                if getattr(spec, attr) == local:
                    setattr(spec, attr, remote)
