"""Which backends can run which method. The exporters room edits the non-eager entries.

A backend maps to the presets (or `+` combinations) it supports; `"*"` means every method.
"""

from __future__ import annotations

BACKEND_SUPPORT: dict[str, list[str]] = {
    "eager": ["*"],
    "executorch": [],
    "onnxruntime": [],
}


def backends_for(method_name: str) -> list[str]:
    """The backends that list `method_name` (or every method)."""
    return [b for b, names in BACKEND_SUPPORT.items() if "*" in names or method_name in names]
