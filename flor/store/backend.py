"""The storage interface: five verbs over relative keys and bytes, picked by URL scheme.

Keys are relative ``/``-separated paths (``objects/ab/cdef``, ``runs/<run>/run.json``); a
backend maps them below its root (a folder, or ``s3://bucket/prefix``).

>>> from flor.store.backend import open_backend
>>> import tempfile
>>> backend = open_backend(tempfile.mkdtemp())
>>> backend.write("runs/r/a.json", b"{}"); backend.read("runs/r/a.json")
b'{}'
>>> backend.list("runs/r/")
['runs/r/a.json']
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from ..errors import ConfigError

__all__ = ["Backend", "open_backend"]


@runtime_checkable
class Backend(Protocol):
    """What flor needs from a place that holds bytes: ``LocalBackend``, ``S3Backend``."""

    def read(self, key: str) -> bytes:
        """The bytes at ``key``; ``StorageError`` when it is missing or unreadable."""
        ...

    def write(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` at ``key``, whole or not at all."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """Every key below ``prefix``, sorted."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""
        ...


def open_backend(url_or_path: str | Path) -> Backend:
    """The backend for ``url_or_path``: ``s3://bucket/prefix``, ``file:///path`` or a path.

    boto3 is imported only for ``s3://``.

    >>> type(open_backend("/tmp/x")).__name__
    'LocalBackend'
    """
    text = str(url_or_path)
    scheme = text.partition("://")[0].lower() if "://" in text else ""
    if scheme == "s3":
        from .s3 import S3Backend

        return S3Backend(text)
    if scheme in ("", "file"):
        from .local import LocalBackend

        return LocalBackend(Path(text[len("file://"):] if scheme else text))
    raise ConfigError(f"unknown storage URL scheme {scheme!r} in {text!r}: use a path, file:///path or s3://bucket/prefix")
