"""``import flor`` gives exactly the public names the docs promise (``flor/__init__.py``).

A name added to or dropped from ``flor.__all__`` changes what ``from flor import *`` binds in
users' scripts: this list changes only on purpose, with the docs.
"""

from __future__ import annotations

import flor

PUBLIC = [
    "CheckpointError",
    "ConfigError",
    "CorruptBlobError",
    "FlorError",
    "ReplayError",
    "SkipBlock",
    "StateError",
    "StorageError",
    "__version__",
    "arg",
    "checkpoints",
    "dataframe",
    "it",
    "load",
    "log",
    "recording",
    "replaying",
]


def test_flor_all_is_the_public_api_sorted() -> None:
    assert flor.__all__ == PUBLIC == sorted(PUBLIC)


def test_every_public_name_resolves() -> None:
    namespace: dict[str, object] = {}
    exec("from flor import *", namespace)  # what a script's star import binds
    assert sorted(k for k in namespace if k != "__builtins__") == PUBLIC
    for name in PUBLIC:
        assert getattr(flor, name) is namespace[name], name
    assert issubclass(flor.ConfigError, flor.FlorError) and isinstance(flor.__version__, str)
    assert callable(flor.log) and callable(flor.it) and hasattr(flor.SkipBlock, "step_into")
