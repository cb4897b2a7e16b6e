"""Which backends can run which method. The exporters room edits the non-eager entries.

A backend maps to the presets (or `+` combinations) it supports; `"*"` means every method.
"""

from __future__ import annotations



def _presets_on(backend: str) -> list[str]:
    """Presets the exported backend runs (edgebench.backends.support says why the others don't)."""
    from edgebench.backends.support import unsupported_reason
    from edgebench.methods.knobs import PRESETS, parse_method

    return [name for name in PRESETS if unsupported_reason(parse_method(name), backend) is None]


BACKEND_SUPPORT: dict[str, list[str]] = {
    "eager": ["*"],
    "executorch": _presets_on("executorch"),
    "onnxruntime": _presets_on("onnxruntime"),
}


def backends_for(method_name: str) -> list[str]:
    """The backends that list `method_name` (or every method)."""
    return [b for b, names in BACKEND_SUPPORT.items() if "*" in names or method_name in names]
