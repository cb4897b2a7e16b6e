"""What comes from outside edgebench's own code: the one rule for names that become part of
a host path, and the one filter for text that reaches a terminal.

A name from a device (a run id in meta.json, a file a device lists), a file (a dataset's
JSONL, an inventory entry, a RunSpec) or the command line (--device) never chooses where
edgebench writes or reads:

- `path_name` accepts one plain path component: letters, digits, '.', '_', '+', '-'; not
  empty, not hidden ('.x'), so never '.', '..', a separator or an absolute path.
- `inside` joins a relative path (components split on '/') to a folder and refuses it unless
  every component is a real name (no '..', no '.', nothing absolute) and the result, symlinks
  followed, is still inside the folder.

- `regular_file` is the one rule for opening a file from a dataset, a run directory or a
  store's folder: `inside` it, a regular file (no device, pipe or folder: a link to
  /dev/zero would read without end), of at most a stated size, checked before any read.

All raise `UnsafeName` (a ValueError) naming what was refused and the rule, in one line.

A record read from such a file is checked once, where it is read, against its one typed
definition (result.json's `end`: `edgebench.figures.run_end.RunEnd`; meta.json:
`edgebench.figures.run_meta.RunMeta`; each event of events.jsonl: `edgebench.figures.run_events`;
each line of samples.jsonl: `edgebench.figures.run_samples`; another store's rows:
`edgebench.results.store_rows`);
a field of the wrong type, out of its range or too long raises `BadRecord` (a ValueError), one
line naming the file, the record and the field.

`printable` removes control characters (and whole escape sequences: a title-setting
`ESC ] 0; ... BEL`, a clear-screen `ESC [ 2 J`) from text a device or a run directory
supplied, before any table, live view, report or message shows it; `quote` is the short,
printable repr of a bad value that an error message names (never the whole input).

Standard library only: the device side (data, runner) uses it too.
"""

from __future__ import annotations

import os
import re
import reprlib
import stat
from pathlib import Path

from edgebench.errors import EdgebenchError

SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}")
NAME_RULE = "use letters, digits, '.', '_', '+' and '-' (no '..', '/', or leading '.')"


class UnsafeName(EdgebenchError, ValueError):
    """A name from outside that would leave its folder; the message names it and the rule."""


class BadRecord(EdgebenchError, ValueError):
    """A record from a file or a device that is not what edgebench writes (a field of the wrong
    type, out of its range, too long); the message names the file, the record and the field."""


def path_name(name: object, what: str) -> str:
    """`name` when it is one plain path component; else UnsafeName naming `what`."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise UnsafeName(f"{what} {printable(repr(name))} is not a safe file name: {NAME_RULE}")
    return name


def inside(folder: str | os.PathLike[str], relative: object, what: str) -> Path:
    """`folder / relative`, refused (UnsafeName) unless `relative` is a relative path without
    '..' or '.' components and the result, with every symlink followed, stays in `folder`."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise UnsafeName(f"{what} {printable(repr(relative))} is not a relative path inside {folder}")
    parts = relative.replace("\\", "/").split("/")
    if relative.startswith(("/", "\\")) or os.path.isabs(relative) or any(p in ("", ".", "..") for p in parts):
        raise UnsafeName(f"{what} {printable(repr(relative))} must be a path inside {folder}: relative, without "
                         "'..', '.' or empty parts")
    root = Path(folder).resolve()
    target = (root / Path(*parts)).resolve()
    if not target.is_relative_to(root):
        raise UnsafeName(f"{what} {printable(repr(relative))} leads outside {folder} (a symlink to "
                         f"{printable(str(target))}); copy the file into the folder instead")
    return Path(folder) / Path(*parts)


def regular_file(folder: str | os.PathLike[str], relative: str, what: str, max_bytes: int) -> Path | None:
    """`folder / relative` when it is a regular file inside `folder` (`inside`) of at most
    `max_bytes`; None when there is none; else UnsafeName saying which rule it broke."""
    path = inside(folder, relative, what)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeName(f"{what} {printable(str(path))} is not a regular file (a device, pipe, socket or folder); "
                         "put the file itself there")
    if info.st_size > max_bytes:
        raise UnsafeName(f"{what} {printable(str(path))} holds {info.st_size:,} bytes, more than the "
                         f"{max_bytes:,} bytes such a file may hold; is it the right file?")
    return path


# Escape sequences whole (CSI: ESC [ ... final byte; OSC/DCS/PM/APC/SOS: up to BEL or ST; any
# other ESC x), then every C0 and C1 control character but newline; tab becomes a space.
_SEQUENCES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]?|\x9b[0-?]*[ -/]*[@-~]?"
                        r"|[\x1b][\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                        r"|[\x90\x9d\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                        r"|\x1b[\x20-\x7e]?")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # bidi overrides too


def printable(text: object, newlines: bool = True, limit: int | None = None) -> str:
    """`text` (str() of it) without control characters or escape sequences, safe for a terminal;
    without `newlines`, a newline becomes a space too (one-line messages, table cells); with
    `limit`, at most that many characters, a cut one ending in "…" (a device's 20 MB string
    shown whole would bury the screen)."""
    text = _CONTROLS.sub("", _SEQUENCES.sub("", str(text)).replace("\t", " "))
    text = text if newlines else text.replace("\n", " ")
    return text if limit is None or len(text) <= limit else text[:limit - 1] + "…"


_SHALLOW = reprlib.Repr()  # attributes, not keywords: the device side runs Python 3.10
_SHALLOW.maxlevel, _SHALLOW.maxstring, _SHALLOW.maxother = 2, 80, 80


def quote(value: object, limit: int = 60) -> str:
    """The repr of a value from a file or a device for a one-line error: at most `limit`
    characters, printable; shallow (two levels, a few items each), so a huge or alias-shared
    value costs nothing to show."""
    text = printable(_SHALLOW.repr(value), newlines=False)
    return text if len(text) <= limit else text[:limit - 3] + "..."
