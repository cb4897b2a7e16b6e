"""Reading a YAML file a user or a board wrote (device profiles, the inventory), bounded.

PyYAML's aliases share nodes, so a few lines (`b: [*a, *a, ...]` nine levels deep) stand for
billions of values: loading is cheap, but anything that walks the result (validation, an
error message formatting it) never ends. So the file is read with limits checked before
anything is built: at most MAX_BYTES of UTF-8 text, and at most MAX_VALUES values once every
alias is expanded (a recursive alias counts as unbounded). Each refusal is one line naming the
file; the caller's error class carries it (ProfileError, InventoryError).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 4 * 2**20
MAX_VALUES = 100_000  # a profile holds ~50 values, an inventory ~20 per device


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """The YAML document in `path` (None when empty); `error` naming the file when it is not
    readable, not UTF-8 text, not YAML, or larger than the limits allow."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror})") from None
    if len(raw) > MAX_BYTES:
        raise error(f"{path}: larger than {MAX_BYTES // 2**20} MiB; a YAML file of settings is a few KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a text file (byte {exc.start} is not UTF-8); write it as YAML text") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_values(node, {}) > MAX_VALUES:
            raise error(f"{path}: its aliases expand to more than {MAX_VALUES:,} values (recursive or nested "
                        "aliases); write the values out")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({exc})") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply to be a YAML file of settings") from None
    finally:
        loader.dispose()


def _expanded_values(node: yaml.Node, seen: dict[int, int]) -> int:
    """How many values `node` stands for with every alias expanded, each shared node counted once
    per use (memoised, so the walk is as long as the file, not as the expansion)."""
    if id(node) in seen:
        return seen[id(node)]
    seen[id(node)] = MAX_VALUES + 1  # reached again while being counted: a recursive alias
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    total = 1
    for child in children:
        total = min(total + _expanded_values(child, seen), MAX_VALUES + 1)
    seen[id(node)] = total
    return total
