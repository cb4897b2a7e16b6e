"""Hugging Face datasets as nanoVLM reads them, turned into a folder dataset (host side).

nanoVLM trains on the_cauldron's shape: an `images` column (a list of images, each stored
by `datasets` as {bytes, path}) and a `texts` column (a list of {user, assistant} turns).
Users have it on disk as a `save_to_disk` folder (state.json + Arrow stream files) or as
parquet files. This reads both with pyarrow (no `datasets`, no hub) and writes the folder
format of edgebench.data.folder: the image bytes as files, one JSONL line per row naming
the row it came from, and the dataset folder's tokenizer.json. The device then reads what
it always reads, and deploy ships the folder like any other.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebench.data.folder import DatasetError

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
            return [folder / entry["filename"] for entry in state["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"{folder / STATE_FILE}: not a datasets save_to_disk state ({exc}); "
                               "save the dataset again with Dataset.save_to_disk") from exc
    return sorted(folder.rglob("*.parquet"))


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


def rows(folder: Path) -> Iterator[tuple[str, list[Any], list[Any]]]:
    """(where, images, texts) for each row, where = "file row N"; the columns are checked first."""
    for path in _files(folder):
        number = 0
        for batch in _batches(path):
            for images, texts in zip(batch.column("images").to_pylist(), batch.column("texts").to_pylist()):
                yield f"{path} row {number}", images, texts
                number += 1


def _image_bytes(image: Any, where: str, folder: Path) -> bytes:
    """One stored image: its bytes, or the file its path names (absolute, or in the dataset folder)."""
    stored = image.get("bytes") if isinstance(image, dict) else None
    if isinstance(stored, bytes) and stored:
        return stored
    path = Path(image["path"]) if isinstance(image, dict) and image.get("path") else None
    if path is not None and not path.is_absolute():
        path = folder / path
    if path is None or not path.is_file():
        raise DatasetError(f"{where}: an image has neither bytes nor a readable file ({image!r:.80}); store the "
                           "images in the dataset (datasets' Image feature)")
    return path.read_bytes()


def _write_rows(folder: Path, staging: Path) -> list[str]:
    """Each row's images as files in `staging`/images, and its JSONL line."""
    lines = []
    for row, (where, images, texts) in enumerate(rows(folder)):
        if not isinstance(images, list):
            raise DatasetError(f"{where}: images must be a list of images")
        names = []
        for k, image in enumerate(images):
            names.append(f"images/{row:06d}-{k}")
            (staging / names[-1]).write_bytes(_image_bytes(image, where, folder))
        lines.append(json.dumps({"images": names, "texts": texts, "origin": where}))
    if not lines:
        raise DatasetError(f"{folder}: no rows")
    return lines


def convert(folder: Path, out: Path) -> Path:
    """Writes `folder`'s rows as a folder dataset into `out` (replaced whole); returns `out`."""
    tokenizer = folder / "tokenizer.json"
    if not tokenizer.is_file():
        raise DatasetError(f"{tokenizer}: tokenizer.json not found; put the model's tokenizer.json in the dataset "
                           "folder")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "images").mkdir(parents=True)
    try:
        lines = _write_rows(folder, staging)
    except BaseException:  # a refused or interrupted conversion leaves nothing behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (staging / "data.jsonl").write_text("\n".join(lines) + "\n")
    shutil.copyfile(tokenizer, staging / "tokenizer.json")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out
