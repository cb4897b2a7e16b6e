"""The one table of backends (edgebench.backends.base.BACKENDS): each entry's implementation
imports and is the backend it names, so `create` and every choice read from the table agree."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edgebench.backends import BACKENDS, UnsupportedBackend, create


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_entry_builds_the_backend_it_names(name):
    backend = create(SimpleNamespace(backend=name))
    assert backend.name == name
    assert all(callable(getattr(backend, method, None)) for method in ("setup", "step", "close"))


def test_an_unknown_backend_is_refused_naming_the_choices():
    with pytest.raises(UnsupportedBackend, match="unknown backend 'tflite'; choose one of eager, executorch, "
                                                 "onnxruntime"):
        create(SimpleNamespace(backend="tflite"))
