"""Open a file of a store, which may be shared and so is untrusted: the one way every reader does it.

A file in a store may have been replaced by something that is not a file: a FIFO named
``run.json`` blocks ``open`` forever, ``/dev/zero`` (or a link to it) never ends, a link
named like a log leads to a file outside the store, and a regular file of many GB is
read whole into memory. So every read of a store file goes through ``open_file``:

- the last component is opened with ``O_NOFOLLOW`` (a symbolic link is refused, wherever
  it points: a store written by flor holds none) and ``O_NONBLOCK`` (opening a FIFO
  returns at once instead of waiting for a writer);
- one ``fstat`` of the opened descriptor then requires a regular file (no race between a
  check and the open);
- ``read_bytes`` reads at most ``limit`` bytes (``MAX_METADATA`` for JSON and other
  metadata) and refuses a larger file with a clear error.

Errors are ``StoreFileError`` (an ``OSError``, so readers that skip an unreadable file keep
doing so) whose text names the file, the problem and what to do.

>>> import tempfile, os
>>> p = Path(tempfile.mkdtemp()) / "run.json"; _ = p.write_bytes(b"{}")
>>> read_bytes(p)
b'{}'
>>> os.remove(p); os.mkfifo(p); read_bytes(p)
Traceback (most recent call last):
...
flor._files.StoreFileError: ...run.json: a FIFO, not a regular file; move it out of the store ...
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator

from ._fmt import human_size

__all__ = ["MAX_LINE", "MAX_METADATA", "MAX_OUTPUT", "StoreFileError", "lines", "open_append", "open_file",
           "read_bytes", "read_lines", "read_text"]

#: the most bytes a JSON or other metadata file of a store (run.json, a manifest, a summary, a
#: launch record, marks, the spool journal) may hold: flor's own are kilobytes to a few MB
MAX_METADATA = 256 * 1024 * 1024
#: the most bytes of a run's printed output (``stdout.log``) that ``flor metrics`` reads whole
MAX_OUTPUT = 2 * 1024 * 1024 * 1024
#: the longest line a JSON-lines file may have (a log record, a mark); a longer one is skipped
MAX_LINE = 16 * 1024 * 1024

_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_APPEND = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
           | getattr(os, "O_CLOEXEC", 0))
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
_FIX = "move it out of the store (`flor verify NAME` lists such problems)"


class StoreFileError(OSError):
    """A store file that must not be read: not a regular file, a symbolic link, or too large."""


def _refuse(path: str | Path, why: str, err: int = errno.EINVAL) -> StoreFileError:
    exc = StoreFileError(err, f"{path}: {why}; {_FIX}")
    exc.filename = None  # str(exc) is the message alone, as readers print it
    return exc


def _open(path: str | Path, flags: int, refusing: str, mode: int = 0o644) -> tuple[int, int]:
    """``(fd, size)`` of the regular file ``path`` opened with ``flags`` (which hold O_NOFOLLOW and
    O_NONBLOCK), set blocking again; a ``StoreFileError`` ending in ``refusing`` for a link or
    anything but a regular file."""
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise _refuse(path, f"a symbolic link (to {os.readlink(path)!r:.120}), not a file{refusing}") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
            raise _refuse(path, f"{kind}, not a regular file{refusing}")
        if flags & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)  # a regular file: reads never wait anyway; keep plain semantics
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def open_file(path: str | Path) -> tuple[int, int]:
    """``(fd, size)`` of the regular file ``path``, opened read-only without following a link
    at its last component; a ``StoreFileError`` for anything else (``FileNotFoundError`` and
    other ``OSError`` pass through). The caller closes ``fd``."""
    return _open(path, _FLAGS, "")


def open_append(path: str | Path, mode: int = 0o644) -> int:
    """A descriptor appending to the regular file ``path`` (made with ``mode`` when missing),
    opened without following a link at its last component: a link planted at a log of an
    existing run (``logs/record.jsonl -> ~/.bashrc``) is refused (``StoreFileError``), never
    written through. The caller closes it (``os.fdopen(fd, "a")`` makes a file object of it)."""
    return _open(path, _APPEND, "; flor does not write through it", mode)[0]


def read_bytes(path: str | Path, *, limit: int | None = MAX_METADATA) -> bytes:
    """The bytes of the regular file ``path``: at most ``limit`` (None: no limit, for blobs,
    which are checked against their hash instead)."""
    fd, size = open_file(path)
    try:
        if limit is not None and size > limit:
            raise _refuse(path, f"{human_size(size)}, over the {human_size(limit)} flor reads of such a file: "
                                "damaged or planted", errno.EFBIG)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read() if limit is None else fh.read(limit + 1)
        if limit is not None and len(data) > limit:  # grew since the fstat
            raise _refuse(path, f"over the {human_size(limit)} flor reads of such a file", errno.EFBIG)
        return data
    finally:
        os.close(fd)


def read_text(path: str | Path, *, limit: int | None = MAX_METADATA) -> str:
    """``read_bytes`` decoded as UTF-8, undecodable bytes replaced."""
    return read_bytes(path, limit=limit).decode("utf-8", errors="replace")


def read_lines(path: str | Path) -> BinaryIO:
    """The regular file ``path`` opened for binary reading, to iterate with ``lines``."""
    fd, _ = open_file(path)
    return os.fdopen(fd, "rb")


def lines(fh: BinaryIO, limit: int = MAX_LINE) -> Iterator[bytes]:
    """Each line of ``fh`` (with its newline); a line over ``limit`` bytes is yielded as
    ``b"\\0\\n"``, which no parser accepts, and its rest is skipped, so a file without newlines
    costs no memory."""
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of the over-long line
                raw = fh.readline(limit)
            yield b"\0\n"  # a damaged line (the reader's parser refuses it)
            continue
        yield raw
