"""Hugging Face datasets as nanoVLM reads them, turned into a folder dataset (host side).

nanoVLM trains on the_cauldron's shape: an `images` column (a list of images, each stored
by `datasets` as {bytes, path}) and a `texts` column (a list of {user, assistant} turns).
Users have it on disk as a `save_to_disk` folder (state.json + Arrow stream files) or as
parquet files. This reads both with pyarrow (no `datasets`, no hub) and writes the folder
format of edgebench.data.folder: the image bytes as files, one JSONL line per row naming
the row it came from, and the dataset folder's tokenizer.json where it has one (else the run
finds the model's: edgebench.data.folder.find_tokenizer). The device then reads what it
always reads, and deploy ships the folder like any other.

An image stored as a path (`{bytes: null, path: ...}`) follows the folder format's rule
(edgebench.untrusted.inside): a relative path inside the dataset folder, else the row is
refused before the file is read, so no host file (/etc/shadow, ../../x) lands in the cache.
Each written file keeps the permission bits of the file its content came from, so a 0600
source never becomes world-readable in the cache.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebench.data.folder import DatasetError
from edgebench.untrusted import UnsafeName, inside, printable

if TYPE_CHECKING:
    import pyarrow as pa

STATE_FILE = "state.json"  # what datasets' save_to_disk writes beside its Arrow files
SPLITS_FILE = "dataset_dict.json"  # ... and above one folder per split, for a DatasetDict


def is_hf_dataset(folder: Path) -> bool:
    """A save_to_disk folder, or a folder holding parquet files (not a JSONL folder dataset)."""
    return ((folder / STATE_FILE).is_file() or (folder / SPLITS_FILE).is_file()
            or (not any(folder.glob("*.jsonl")) and any(folder.rglob("*.parquet"))))


def _files(folder: Path) -> list[Path]:
    if (folder / SPLITS_FILE).is_file():
        splits = sorted(p.name for p in folder.iterdir() if (p / STATE_FILE).is_file())
        raise DatasetError(f"{folder}: a DatasetDict of splits {', '.join(splits)}; pass one split's folder, "
                           f"e.g. {folder / (splits[0] if splits else 'train')}")
    if (folder / STATE_FILE).is_file():
        try:
            state = json.loads((folder / STATE_FILE).read_text())
            names = [entry["filename"] for entry in state["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"{folder / STATE_FILE}: not a datasets save_to_disk state ({exc}); "
                               "save the dataset again with Dataset.save_to_disk") from exc
        return [_inside(folder, name, f"{folder / STATE_FILE}: _data_files[{k}] field 'filename'")
                for k, name in enumerate(names)]
    return [_inside(folder, path.relative_to(folder).as_posix(), "parquet file")
            for path in sorted(folder.rglob("*.parquet"))]


def _inside(folder: Path, name: object, what: str) -> Path:
    """The folder format's rule for a path from data (edgebench.untrusted.inside), as a DatasetError."""
    try:
        return inside(folder, name, what)
    except UnsafeName as exc:
        raise DatasetError(f"{exc}; store the data in the dataset folder (images as bytes: datasets' Image "
                           "feature with embed_external_files)") from None


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The file's images/texts record batches, read a few rows at a time (images can be GBs)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            parquet = pq.ParquetFile(path)
            _check_columns(path, parquet.schema_arrow.names)
            yield from parquet.iter_batches(batch_size=64, columns=["images", "texts"])
            return
        with pa.OSFile(str(path)) as source:
            stream = pa.ipc.open_stream(source)  # save_to_disk writes Arrow streams
            _check_columns(path, stream.schema.names)
            yield from stream
    except (OSError, pa.ArrowInvalid) as exc:
        raise DatasetError(f"{path}: not a readable {path.suffix[1:]} file ({exc})") from exc


def _check_columns(path: Path, names: list[str]) -> None:
    missing = [c for c in ("images", "texts") if c not in names]
    if missing:
        raise DatasetError(
            f"{path}: no {' or '.join(missing)} column (found {', '.join(names)}); nanoVLM's datasets "
            "have images (a list of images) and texts (a list of {user, assistant} turns), as the_cauldron"
        )


def rows(folder: Path) -> Iterator[tuple[str, Path, list[Any], list[Any]]]:
    """(where, data file, images, texts) for each row, where = "file row N"; the columns are checked first."""
    for path in _files(folder):
        number = 0
        for batch in _batches(path):
            for images, texts in zip(batch.column("images").to_pylist(), batch.column("texts").to_pylist()):
                yield f"{path} row {number}", path, images, texts
                number += 1


def _image_source(image: Any, where: str, folder: Path, data_file: Path) -> tuple[bytes, int]:
    """One stored image: its bytes and the mode of the file they came from (the data file for
    stored bytes, else the file its path names, which must be inside the dataset folder)."""
    stored = image.get("bytes") if isinstance(image, dict) else None
    if isinstance(stored, bytes) and stored:
        return stored, _mode(data_file)
    name = image.get("path") if isinstance(image, dict) else None
    if not name:
        raise DatasetError(f"{where} has neither bytes nor a path ({printable(repr(image))[:80]}); store "
                           "the images in the dataset (datasets' Image feature)")
    path = _inside(folder, name, f"{where} field 'path'")
    if not path.is_file():
        raise DatasetError(f"{where}: field 'path' {path} is not a readable file in the dataset folder")
    return path.read_bytes(), _mode(path)


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o666


def _write(path: Path, data: bytes, mode: int) -> None:
    """`data` into a new file `path` created with `mode` (the umask can only narrow it)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data)


def _write_rows(folder: Path, staging: Path) -> None:
    """Each row's images as files in `staging`/images, and data.jsonl with a line per row (its
    mode: what every data file's mode allows, as its texts come from all of them)."""
    lines, mode = [], 0o666
    for row, (where, data_file, images, texts) in enumerate(rows(folder)):
        if not isinstance(images, list):
            raise DatasetError(f"{where}: images must be a list of images")
        names = []
        for k, image in enumerate(images):
            names.append(f"images/{row:06d}-{k}")
            _write(staging / names[-1], *_image_source(image, f"{where}: images[{k}]", folder, data_file))
        lines.append(json.dumps({"images": names, "texts": texts, "origin": where}))
        mode &= _mode(data_file)
    if not lines:
        raise DatasetError(f"{folder}: no rows")
    _write(staging / "data.jsonl", ("\n".join(lines) + "\n").encode(), mode)


def convert(folder: Path, out: Path) -> Path:
    """Writes `folder`'s rows as a folder dataset into `out` (replaced whole); returns `out`."""
    tokenizer = _inside(folder, "tokenizer.json", "tokenizer")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "images").mkdir(parents=True)
    try:
        _write_rows(folder, staging)
        if tokenizer.is_file():
            _write(staging / "tokenizer.json", tokenizer.read_bytes(), _mode(tokenizer))
    except BaseException:  # a refused or interrupted conversion leaves nothing behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out
