"""The FlorError tree.

::

    FlorError                  base of everything flor raises on purpose
    ├── ConfigError            bad flags, environment variables or experiment names
    ├── StorageError           the store cannot be read or written
    │   └── CorruptBlobError   a blob's bytes no longer match its hash
    ├── CheckpointError        a checkpoint is missing or unusable
    ├── StateError             an object cannot be captured or restored
    └── ReplayError            the script no longer matches the recording

Every message says what happened, shows the offending value and says what to do next.
"""

from __future__ import annotations

import warnings

__all__ = [
    "CheckpointError",
    "ConfigError",
    "CorruptBlobError",
    "FlorError",
    "ReplayError",
    "StateError",
    "StorageError",
    "warn",
]


class FlorError(Exception):
    """Base class of every error flor raises on purpose."""


class ConfigError(FlorError):
    """A flag, environment variable or experiment name is invalid."""


class StorageError(FlorError):
    """The store cannot be read or written."""


class CorruptBlobError(StorageError):
    """A blob's bytes do not match the hash it is named by."""


class CheckpointError(FlorError):
    """A checkpoint is missing, incomplete or does not fit the objects given."""


class StateError(FlorError):
    """An object passed to ``SkipBlock.end`` cannot be captured or restored."""


class ReplayError(FlorError):
    """The script being replayed no longer matches its recording."""


def warn(code: str, message: str) -> None:
    """A warning that never stops training, printed once per message: ``flor: FL204 ...``
    (``code``: a finding of ``flor.findings.CATALOGUE``)."""
    warnings.warn(f"flor: {code} {message}", RuntimeWarning, stacklevel=3)
