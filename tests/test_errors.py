"""One base for edgebench's own exceptions (edgebench/errors.py): every exception class the
package defines subclasses EdgebenchError, and the command maps each to one line and exit code 2
without a hand list."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import edgebench
import exporters
from edgebench.errors import EdgebenchError


def _modules() -> list[str]:
    names = []
    for package in (edgebench, exporters):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            if not info.name.endswith("__main__"):  # runs its command when imported
                names.append(info.name)
    return names


def _exception_classes() -> dict[str, type]:
    found = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == name:
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_of_the_package_subclasses_edgebench_error():
    classes = _exception_classes()
    assert len(classes) >= 25  # the walk found them (every module imports here)
    strays = sorted(name for name, cls in classes.items() if not issubclass(cls, EdgebenchError))
    assert strays == [], (
        f"subclass edgebench.errors.EdgebenchError (keeping a second base if callers need it): {strays}"
    )


def test_the_second_bases_callers_catch_are_kept():
    from edgebench.devices.profiles import ProfileError
    from edgebench.devices.transport import TransportError
    from edgebench.methods.knobs import MethodError

    assert issubclass(MethodError, ValueError) and issubclass(ProfileError, ValueError)
    assert issubclass(TransportError, RuntimeError)


@pytest.mark.parametrize("where", ["edgebench.backends.base:UnsupportedBackend", "exporters.pipeline:ExportRefused",
                                   "edgebench.methods.optimizers:UnknownOptimizer"])
def test_the_command_shows_any_edgebench_error_as_one_line_and_exit_code_2(where, monkeypatch, capsys):
    """Classes the command used to call internal errors (exit 1) are user errors by their base."""
    from edgebench.cli import cli, main

    module, _, name = where.partition(":")
    error = getattr(importlib.import_module(module), name)

    def raises(*args, **kwargs):
        raise error("the board has no such thing;\nuse another")

    monkeypatch.setattr(cli.commands["models"], "callback", raises)
    with pytest.raises(SystemExit) as done:
        main(["models"])
    assert done.value.code == 2
    assert capsys.readouterr().err == "error: the board has no such thing; use another\n"


def test_an_error_of_no_edgebench_class_is_still_an_internal_error(monkeypatch, capsys):
    from edgebench.cli import cli, main

    def raises(*args, **kwargs):
        raise KeyError("delegate")

    monkeypatch.setattr(cli.commands["models"], "callback", raises)
    with pytest.raises(SystemExit) as done:
        main(["models"])
    assert done.value.code == 1 and "internal error: KeyError: 'delegate'" in capsys.readouterr().err
