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

import re
import warnings

__all__ = [
    "CheckpointError",
    "ConfigError",
    "CorruptBlobError",
    "FlorError",
    "ReplayError",
    "StateError",
    "StorageError",
    "printable",
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


#: C0 controls but tab and newline, DEL, and C1 controls (CSI, OSC...): what a terminal acts on
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object, *, newlines: bool = True) -> str:
    r"""``text`` with every character a terminal would act on (ESC sequences such as OSC 52
    clipboard writes, a CR that overwrites the line, bidirectional overrides) written as a
    visible escape: what a store says is shown, never obeyed. With ``newlines=False`` a newline
    is escaped too (a name printed on one line must stay on it).

    >>> printable("loss\x1b]52;c;aGk=\x07\rflor: replay verified exact")
    'loss\\x1b]52;c;aGk=\\x07\\rflor: replay verified exact'
    """
    text = str(text)
    pattern = _CONTROL if newlines else _CONTROL_NL
    if not pattern.search(text):
        return text
    return pattern.sub(_escape, text)


_CONTROL_NL = re.compile(_CONTROL.pattern[:-1] + "\n]")


def _escape(m: re.Match) -> str:
    c = m.group()
    return {"\r": "\\r", "\n": "\\n"}.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def warn(code: str, message: str) -> None:
    """A warning that never stops training, printed once per message: ``flor: FL204 ...``
    (``code``: a finding of ``flor.findings.CATALOGUE``)."""
    warnings.warn(f"flor: {code} {printable(message)}", RuntimeWarning, stacklevel=3)  # it may quote a store
