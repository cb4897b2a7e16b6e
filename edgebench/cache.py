"""Where edgebench keeps what it builds or measures once per host: `$EDGEBENCH_CACHE`, else
~/.cache/edgebench (the export cache has its own variable: exporters.manifest.cache_root)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """A folder under the cache (not created)."""
    return Path(os.environ.get("EDGEBENCH_CACHE") or "~/.cache/edgebench").expanduser().joinpath(*parts)
