"""sha256 of every file under a folder, by path relative to it (a shipped checkpoint or
dataset, checked after unpacking). Standard library only; runs with `python -c`.
Usage: digests.py FOLDER (prints one JSON object {relative/path: sha256}). digests.sh is its
twin for a device with no Python.
"""

import hashlib
import json
import os
import sys

SKIP = (".edgebench-verified",)


def file_digest(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def digests(folder: str) -> dict[str, str]:
    out = {}
    for base, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if rel not in SKIP:
                out[rel] = file_digest(path)
    return out


if __name__ == "__main__":
    print(json.dumps(digests(sys.argv[1]), sort_keys=True))
