"""The local filesystem backend: keys are relative POSIX paths under one root."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from ..errors import StorageError

__all__ = ["LocalBackend"]


class LocalBackend:
    """Atomic reads and writes of byte strings under ``root``: a ``flor.store.backend.Backend``,
    plus the extras ``path`` and ``sync_dir``.

    Every write goes to a temporary file in the destination folder, is fsynced and then
    renamed over the destination, so a reader sees the old bytes or the new ones, never
    a torn file, and a crash leaves at worst a stray ``.tmp-*`` file.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key

    def write(self, key: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        dest = self.path(key)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.parent / f".tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as fh:
                fh.write(data)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, dest)
        except OSError as exc:
            raise StorageError(f"cannot write {dest}: {exc}; check free space and permissions") from exc

    def read(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError as exc:
            raise StorageError(f"{self.path(key)} is missing from the store") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {self.path(key)}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def list(self, prefix: str) -> list[str]:
        base = self.path(prefix)
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        )

    def delete(self, key: str) -> None:
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            pass

    def sync_dir(self, key: str) -> None:
        """Make the entries of folder ``key`` durable (the renames done in it)."""
        try:
            fd = os.open(self.path(key), os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
