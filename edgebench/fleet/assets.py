"""A user's checkpoint and dataset folders, the tokenizer file --tokenizer names, exported
programs, and the native worker with its plans, shipped to a device once; a Hugging Face
dataset is first turned into the folder format, once per content.

Each folder is content-addressed: the sha256 of every file, and of that list. It lands in
`<workdir>/cache/<digest>-<name>/` and stays there for later sweeps. Before every sweep the
device hashes its cached copy (devices/device_scripts/digests.py): a copy whose files all match
is used as is; any other (a byte flipped, a line appended, a file truncated, added or missing
since it was shipped) is sent again, and deploy says so. Nothing vouches for a copy but its
content: a copy checked once may have changed since. After unpacking, the device hashes it
again. A dataset folder ships only what its runs read (the JSONL, each image named, its
tokenizer.json when that is the one they use), not whatever else lies in the folder; a
tokenizer file ships alone, in a folder of its own. Deploy's disk estimate counts what is to
be shipped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edgebench.cache import cache_dir
from edgebench.devices.device_scripts import digests as digests_script
from edgebench.devices.device_scripts.digests import digests, file_digest
from edgebench.errors import EdgebenchError
from edgebench.fleet.remote import run_program
from edgebench.untrusted import printable

if TYPE_CHECKING:
    from edgebench.devices.inventory import Device
    from edgebench.devices.transport import Transport
    from edgebench.runner.spec import RunSpec

ASSET_FIELDS = {"checkpoint": "checkpoint", "data_dir": "dataset", "tokenizer": "tokenizer", "program": "program",
                "native_worker": "native worker", "native_plan": "native plan"}  # spec field -> what deploy calls it


class AssetError(EdgebenchError, RuntimeError):
    """A folder arrived different from what was sent."""


@dataclass
class Asset:
    """A host folder to ship: the files that go (relative paths), their sha256, the folder's digest."""

    local: Path
    files: dict[str, str]  # relative path -> sha256
    digest: str
    size_bytes: int
    whole: bool  # every file of the folder (a checkpoint), else the subset a dataset uses
    what: str = "folder"  # checkpoint, dataset, program, ... (for deploy's lines)
    entry: str | None = None  # the one file of it a spec names (a tokenizer); None: the spec names the folder

    def remote(self, workdir: str) -> str:
        return f"{workdir}/cache/{self.digest[:24]}-{re.sub(r'[^A-Za-z0-9._-]+', '_', self.local.name)}"


def as_folder_dataset(folder: Path) -> Path:
    """A Hugging Face dataset folder as a folder dataset, converted once per content into
    `$EDGEBENCH_CACHE/datasets/<sha256>/<name>` (the device reads only the folder format);
    any other folder as it is."""
    from edgebench.data import hf

    if not hf.is_hf_dataset(folder):
        return folder
    refuse_links_out(folder)  # before its digest reads every file in it
    digest, _ = folder_digest(folder)
    out = cache_dir("datasets", digest[:24], folder.name)
    if not (out / "data.jsonl").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        hf.convert(folder, out)
    return out


def refuse_links_out(folder: Path) -> None:
    """A dataset folder holding a link that leads outside it is refused before any of its files
    is read (the folder format's rule: data names files inside its folder only)."""
    from edgebench.data.folder import DatasetError

    root = folder.resolve()
    for path in sorted(folder.rglob("*")):
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise DatasetError(f"{path}: a link to {path.resolve()}, outside the dataset folder {folder}; refused "
                               "before anything is read: copy the file into the folder instead")


def dataset_files(folder: Path, spec: RunSpec) -> list[str] | None:
    """What the spec's runs read of a dataset folder: its JSONL, every image a line names and its
    tokenizer.json when that is theirs (relative paths); None when the folder is not a dataset
    (then it ships whole)."""
    from edgebench.data.folder import DatasetError, FolderDataset

    try:
        data = FolderDataset(folder, spec.tokenizer, checkpoint=spec.checkpoint)
    except DatasetError:
        return None
    tokenizer = [data.tokenizer_path] if data.tokenizer_path.is_relative_to(folder) else []
    used = [data.jsonl, *tokenizer, *(image for e in data.examples for image in e.images)]
    return sorted({str(p.relative_to(folder)).replace("\\", "/") for p in used})


def folder_digest(folder: Path, files: list[str] | None = None) -> tuple[str, dict[str, str]]:
    """(digest of the whole folder, or of `files` in it; sha256 per file)."""
    per_file = digests(str(folder)) if files is None else {rel: file_digest(folder / rel) for rel in files}
    return hashlib.sha256(json.dumps(per_file, sort_keys=True).encode()).hexdigest(), per_file


def folder_asset(folder: Path, what: str, subset: list[str] | None = None, entry: str | None = None) -> Asset:
    """`folder` as an asset to ship: whole, or only the `subset` of its files (relative paths)."""
    digest, files = folder_digest(folder, subset)
    return Asset(folder, files, digest, sum((folder / rel).stat().st_size for rel in files), subset is None, what,
                 entry)


def plan_assets(specs: list[RunSpec]) -> dict[str, Asset]:
    """Every host folder or file the specs name (checkpoint: whole; dataset: what its runs read;
    tokenizer: the file alone), by path."""
    out: dict[str, Asset] = {}
    for attr, what in ASSET_FIELDS.items():
        for local in dict.fromkeys(getattr(s, attr) for s in specs if getattr(s, attr)):
            path = Path(local)
            if local in out or not (path.is_file() if attr == "tokenizer" else path.is_dir()):
                continue  # already planned, or already a device path (a spec file written for that device)
            if attr == "tokenizer":
                out[local] = folder_asset(path.parent, what, [path.name], entry=path.name)
            else:
                subset = dataset_files(path, next(s for s in specs if s.data_dir == local)) if attr == "data_dir" \
                    else None
                out[local] = folder_asset(path, what, subset)
    return out


def _differing(sent: dict[str, str], got: dict[str, str]) -> list[str]:
    """The files whose sha256 on the device is not the host's (changed, missing or extra)."""
    return sorted(k for k in set(sent) | set(got) if sent.get(k) != got.get(k))


def _named(files: list[str]) -> str:
    """A few of the files, printable and short (their names may come from the device)."""
    more = f" and {len(files) - 3} more" if len(files) > 3 else ""
    return printable(", ".join(f[:80] for f in files[:3]), newlines=False) + more


def check_cache(transport: Transport, device: Device, workdir: str,
                assets: dict[str, Asset]) -> dict[str, list[str] | None]:
    """Per planned asset (by host path), the files of the device's cached copy that differ from
    the host's: [] when the copy is whole, None when the device has none. Hashed on the device
    at every deploy, so nothing changed since it was shipped ever runs."""
    found: dict[str, list[str] | None] = {}
    for local, asset in assets.items():
        got = run_program(transport, device, digests_script, asset.remote(workdir))
        found[local] = _differing(asset.files, got) if got else None
    return found


def unshipped_bytes(assets: dict[str, Asset], found: dict[str, list[str] | None]) -> int:
    """Bytes of the planned folders the device does not hold whole (deploy's disk estimate)."""
    return sum(a.size_bytes for local, a in assets.items() if found[local] != [])


def ship_folder(transport: Transport, device: Device, asset: Asset, workdir: str, staging: Path,
                ship_tar: Callable[[Transport, Path, str], None], tar_dir: Callable[..., Path],
                log: Callable[[str], None] = lambda _: None, differing: list[str] | None = None) -> str:
    """The device path of the asset's content: the cached copy when `differing` (check_cache's
    finding) is [], else shipped again and verified."""
    local, remote = asset.local / (asset.entry or ""), asset.remote(workdir)
    if differing == []:
        log(f"{device.name}: {asset.what} {local} already on the device ({remote}, sha256 of each file checked)")
        return remote
    if differing:
        log(f"{device.name}: the device's cached copy of {asset.what} {local} differs from it "
            f"({_named(differing)}); sending it again")
    archive = tar_dir(asset.local, ".", staging / f"asset-{asset.digest[:12]}.tar", compress=False,
                      files=None if asset.whole else sorted(asset.files))
    subset = "" if asset.whole or asset.entry else f" ({len(asset.files)} files its runs read)"
    log(f"{device.name}: shipping {asset.what} {local}{subset} ({archive.stat().st_size / 2**20:.1f} MiB) to {remote}")
    transport.check(["rm", "-rf", remote])
    ship_tar(transport, archive, remote)
    bad = _differing(asset.files, run_program(transport, device, digests_script, remote))
    if bad:
        transport.check(["rm", "-rf", remote])
        raise AssetError(f"{device.name}: {local} arrived different from what was sent ({_named(bad)}); "
                         "check the device's free disk space and run deploy again")
    return remote


def ship_assets(transport: Transport, device: Device, specs: list[RunSpec], workdir: str, staging: Path,
                ship_tar: Callable[[Transport, Path, str], None], tar_dir: Callable[..., Path],
                log: Callable[[str], None] = lambda _: None, assets: dict[str, Asset] | None = None,
                found: dict[str, list[str] | None] | None = None) -> None:
    """Ships every folder the specs name that the device does not hold whole (once each;
    `assets`, `found`: plan_assets and check_cache of them, made beforehand) and points the
    specs at the device's copies (a tokenizer: its file in the copy)."""
    assets = plan_assets(specs) if assets is None else assets
    found = check_cache(transport, device, workdir, assets) if found is None else found
    remotes = {local: ship_folder(transport, device, asset, workdir, staging, ship_tar, tar_dir, log, found[local])
               + (f"/{asset.entry}" if asset.entry else "") for local, asset in assets.items()}
    for spec in specs:
        for attr in ASSET_FIELDS:
            if getattr(spec, attr) in remotes:
                setattr(spec, attr, remotes[getattr(spec, attr)])
