"""The local filesystem backend: keys are relative POSIX paths under one root."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import itertools
import os
import re
import socket
import stat
import time
import uuid
from pathlib import Path
from typing import Callable, Iterable

from .._files import StoreFileError, read_bytes
from ..errors import StorageError
from .ids import check_key, contained

__all__ = ["LocalBackend", "TMP_PREFIX", "is_stale_tmp", "remove_stale_tmp", "tmp_name"]

#: the name prefix of a write in progress (``flor verify --repair`` removes leftovers)
TMP_PREFIX = ".tmp-"


_HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
_TMP_RE = re.compile(r"^\.tmp-(?P<host>[A-Za-z0-9]{1,32})-(?P<pid>\d{1,10})-\d+-[0-9a-f]{8}$")
_counter = itertools.count()
#: a temp file of another host (a store on a shared filesystem) is stale once this old
STALE_OTHER_HOST_S = 24 * 3600


def tmp_name() -> str:
    """A temp file name unique to this process and write: ``.tmp-<host>-<pid>-<n>-<random>``."""
    return f"{TMP_PREFIX}{_HOST}-{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:8]}"


def is_stale_tmp(name: str, age_s: float, alive: Callable[[int], bool]) -> bool:
    """Whether a ``.tmp-*`` file is a leftover of a dead writer: its process (on this host) is
    gone, or (another host's, or a name of an older flor) it is over a day old."""
    if not name.startswith(TMP_PREFIX):
        return False
    m = _TMP_RE.match(name)
    if m is None or m["host"] != _HOST:
        return age_s > STALE_OTHER_HOST_S
    pid = int(m["pid"])
    return pid != os.getpid() and not alive(pid)


def remove_stale_tmp(folders: Iterable[str | Path], alive: Callable[[int], bool]) -> int:
    """Remove the stale temp files in ``folders`` (not below them); return how many bytes."""
    freed, now = 0, time.time()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith(TMP_PREFIX):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if is_stale_tmp(entry.name, now - st.st_mtime, alive):
                    os.unlink(entry.path)
                    freed += st.st_size
            except OSError:
                continue  # gone already, or a read-only store: harmless
    return freed


class LocalBackend:
    """Atomic reads and writes of byte strings under ``root``: a ``flor.store.backend.Backend``,
    plus the extras ``path`` and ``sync_dir``.

    Every write goes to a temporary file in the destination folder, is fsynced and then
    renamed over the destination, so a reader sees the old bytes or the new ones, never
    a torn file, and a crash leaves at worst a stray ``.tmp-*`` file (``TMP_PREFIX``).

    Keys are checked (``flor.store.ids.check_key``: no ``..``, absolute paths, backslashes,
    NUL or empty segments), and a read, write or delete whose path leads out of ``root``
    through a symlink is refused: a shared store cannot make flor touch other files. (To
    keep blobs on another disk, move ``FLOR_HOME`` or link the whole experiment folder:
    ``root`` itself is resolved.)
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._root = str(self.root)

    def path(self, key: str) -> Path:
        """Where ``key`` lives; a StorageError for a key that could leave the store."""
        return self.root / check_key(key)

    def _inside(self, key: str, *, parent_only: bool) -> Path:
        path = self.path(key)
        if not contained(path, self.root, parent_only=parent_only):
            raise StorageError(f"refusing {path}: it leads out of the store {self.root} through a symbolic link; "
                               "remove that link (`flor verify NAME` lists such problems)")
        return path

    def _destination(self, key: str) -> str:
        """Where a write of ``key`` goes, its folder made, never through a symbolic link out of the
        store. Where every folder from the root down is a plain folder (``lstat``: a few us) the
        path cannot leave the store, and a missing one is made with ``mkdir`` (which makes a
        folder of its own name, never following a link); otherwise the full check (``contained``:
        resolving the path costs the writer ~80 us, issue #13) runs before any folder is made.
        A string: building ``Path`` objects cost the writer of a small model ~50 us a checkpoint."""
        parts = check_key(key).split("/")
        folder = self._root
        try:
            for part in parts[:-1]:
                folder += "/" + part
                try:
                    mode = os.lstat(folder).st_mode
                except FileNotFoundError:
                    os.mkdir(folder)  # in a plain folder: a plain folder
                    continue
                if not stat.S_ISDIR(mode):  # a link (or a file): the full check
                    raise NotADirectoryError(folder)
        except OSError:
            path = self._inside(key, parent_only=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            return str(path)
        return folder + "/" + parts[-1]

    def write(self, key: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        dest: str | None = None
        tmp = None
        try:
            dest = self._destination(key)
            tmp = os.path.join(os.path.dirname(dest), tmp_name())
            with open(tmp, "xb") as fh:
                fh.write(data)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, dest)
            tmp = None  # renamed: nothing to clean up
        except OSError as exc:
            raise StorageError(f"cannot write {dest or self.root / key}: {exc}; check free space and "
                               "permissions") from exc
        finally:
            if tmp is not None:  # a failed write (full disk) leaves no partial file taking the space
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def reserve(self, key: str, sizes: Iterable[int]) -> Path | None:
        """Set disk space aside in a temp file beside ``key`` (the first of ``sizes``, in bytes,
        that fits), for a write that must succeed when the disk fills later: unlink it, then
        write. None where none fits. Its name is a temp file's, so a writer that dies leaves
        it for ``remove_stale_tmp`` and ``flor verify --repair``."""
        try:
            folder = os.path.dirname(self._destination(key))
        except (OSError, StorageError):
            return None
        for size in sizes:
            path = os.path.join(folder, tmp_name())
            try:
                fd = os.open(path, _CREATE, 0o600)
            except OSError:
                return None
            try:
                os.posix_fallocate(fd, 0, size)  # blocks allocated (glibc writes them where the filesystem cannot)
                return Path(path)
            except OSError:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            finally:
                os.close(fd)
        return None

    def write_batch(self, items: list[tuple[str, bytes | memoryview]]) -> None:
        """Write several keys behind ONE durability barrier (a checkpoint's blobs).

        Every file is written to its temp file straight from the caller's buffer (no copy),
        then all are flushed to disk in one pass (their writeback overlaps), renamed into
        place, and each touched folder is fsynced once. When this returns, every key is
        durable; on an error none of the temp files is left behind (keys renamed already stay:
        each is whole, and named by nothing until the caller's commit marker is written).
        """
        if not items:
            return
        staged: list[tuple[int | None, str, str]] = []  # (fd, tmp path, dest)
        try:
            folders: dict[str, None] = {}
            for key, data in items:
                dest = self._destination(key)
                folder = os.path.dirname(dest)
                folders[folder] = None
                tmp = os.path.join(folder, tmp_name())
                fd = os.open(tmp, _CREATE, 0o644)
                staged.append((fd, tmp, dest))
                if not _write_direct(fd, data):
                    _write_all(fd, data)
            for i, (open_fd, tmp, dest) in enumerate(staged):  # the barrier: all data on disk ...
                assert open_fd is not None  # every file is still open here
                _datasync(open_fd)
                os.close(open_fd)
                staged[i] = (None, tmp, dest)
            for i, (_, tmp, dest) in enumerate(staged):
                os.replace(tmp, dest)
                staged[i] = (None, "", dest)
            for folder in folders:  # ... and all names, one fsync per folder
                _sync_folder(folder)
        except OSError as exc:
            raise StorageError(f"cannot write {len(items)} file(s) under {self.root}: {exc}; "
                               "check free space and permissions") from exc
        finally:
            for left_fd, tmp, _ in staged:
                if left_fd is not None:
                    try:
                        os.close(left_fd)
                    except OSError:
                        pass
                if tmp:  # not renamed: a failed batch leaves no partial file taking the space
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass

    def read(self, key: str, *, limit: int | None = None) -> bytes:
        """The bytes at ``key``: a regular file, not a link (``flor._files``), of at most ``limit``
        bytes (None: any size; the JSON readers pass ``MAX_METADATA``)."""
        path = self._inside(key, parent_only=False)
        try:
            return read_bytes(path, limit=limit)
        except FileNotFoundError as exc:
            raise StorageError(f"{self.path(key)} is missing from the store") from exc
        except StoreFileError as exc:
            why = str(exc.strerror).replace("flor verify NAME", f"flor verify {self.root.name}")
            raise StorageError("refusing " + why) from exc
        except OSError as exc:
            raise StorageError(f"cannot read {self.path(key)}: {exc}") from exc

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def list(self, prefix: str) -> list[str]:
        prefix = prefix.rstrip("/")
        base = self.path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(TMP_PREFIX) and contained(p, self.root)
        )

    def delete(self, key: str) -> None:
        try:
            self._inside(key, parent_only=True).unlink()
        except FileNotFoundError:
            pass

    def sync_dir(self, key: str) -> None:
        """Make the entries of folder ``key`` durable (the renames done in it)."""
        _sync_folder(self.path(key))


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """``os.write`` until all of ``data`` is written, straight from its buffer."""
    view = memoryview(data).cast("B")  # slices of a memoryview copy nothing
    done, size = 0, view.nbytes
    while done < size:
        done += os.write(fd, view[done:done + (1 << 30)])


#: blobs from this size on, in page-aligned buffers, are written around the page cache (O_DIRECT)
DIRECT_MIN = 256 * 1024
PAGE = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def address(view: memoryview) -> int | None:
    """Where a writable buffer starts in memory; None for a read-only one."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    except (TypeError, ValueError):
        return None


def _write_direct(fd: int, data: bytes | memoryview) -> bool:
    """Write ``data`` to the empty file ``fd``: its page-aligned bulk with O_DIRECT, the tail
    through the page cache. Return False, having written nothing, where that cannot be done
    (an unaligned or small buffer, a filesystem without O_DIRECT such as tmpfs).

    A buffered write of a large blob costs the writer 2-4 CPU-s per GB on this project's VM
    (page-cache pages allocated and filled, then written back); O_DIRECT hands the pages of
    the snapshot buffer to the disk: ~0.03 CPU-s per GB (issue #13). The durability barrier
    (``fdatasync``) is still the caller's.
    """
    view = memoryview(data).cast("B")
    bulk = view.nbytes - view.nbytes % PAGE
    if not _O_DIRECT or bulk < DIRECT_MIN or (address(view) or 1) % PAGE:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
        done = 0
        while done < bulk:
            done += os.write(fd, view[done:bulk])
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        _write_all(fd, view[bulk:])
        return True
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise  # a full disk, an I/O error: the caller's to report
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)  # not supported here: start over through the page cache
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        return False


def _datasync(fd: int) -> None:
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def _sync_folder(path: str | Path) -> None:
    """fsync a folder (its entries: the renames done in it); best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
