"""The project's source files a module runs when imported, found by reading the imports.

The export cache key hashes these files, so an edit anywhere in the code an export runs
re-exports; a hand-kept list went stale (it missed the LoRA writer and the optimizers).
Imports are read with `ast` (at module level and inside functions alike, where most of the
exporters' imports live), without importing anything; only modules of the project's own
top-level packages are followed (the libraries are covered by their versions in the key).
"""

from __future__ import annotations

import ast
from pathlib import Path

PROJECT_PACKAGES = ("edgebench", "exporters")


def _module_file(root: Path, module: str) -> Path | None:
    """The file that defines `module` under `root` (a package's __init__.py), or None."""
    base = root.joinpath(*module.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(module: str) -> list[str]:
    """Importing a.b.c runs a, a.b and a.b.c."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _imported_modules(path: Path, module: str) -> set[str]:
    """Every module `path` (the file of `module`) names in an import statement, resolved
    to absolute names; `from pkg import name` yields pkg and pkg.name (a submodule or not)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return found


def import_closure(root: Path, modules: tuple[str, ...]) -> list[Path]:
    """The project files (sorted) that importing `modules` and running their code may
    import: the modules themselves, their packages' __init__ files, and so on transitively."""
    seen: dict[str, Path] = {}
    pending = [name for module in modules for name in _with_parents(module)]
    while pending:
        module = pending.pop()
        if module in seen or module.split(".")[0] not in PROJECT_PACKAGES:
            continue
        path = _module_file(root, module)
        if path is None:
            continue  # `from pkg import function`: pkg.function is no module
        seen[module] = path
        for name in _imported_modules(path, module):
            pending.extend(_with_parents(name))
    return sorted(set(seen.values()))
