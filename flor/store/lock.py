"""The store's lock: recordings share it, ``flor verify --repair`` takes it alone.

A recording writes its blobs before the manifest that names them, so for a while its blobs
are named by nothing; a repair that ran then would delete them as unreferenced. So every
recording holds a shared ``flock`` on the experiment folder itself (no lock file to plant or
to lack permission for; released by the kernel when the process dies, even by SIGKILL), and
a repair takes it exclusively, without waiting: while any recording runs, a repair refuses;
while a repair runs, a recording that starts waits for it, up to ``WAIT_S``, and then goes on
without the lock, warning (FL419): training never waits longer on flor. A repair also keeps
blobs younger than a grace period whatever the lock says (``flor.store.repair``).

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> mine = exclusive(root)
>>> mine is not None and shared(root, wait=0.0) is None
True
>>> release(mine); release(held := shared(root, wait=0.0)); held is not None
True
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..errors import warn

__all__ = ["WAIT_S", "exclusive", "release", "shared"]

#: how long a recording that starts during a repair waits for it before going on unlocked
WAIT_S = 60.0


def _open(root: Path) -> int | None:
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except OSError:
        return None


def shared(root: Path, *, wait: float = WAIT_S) -> int | None:
    """A descriptor holding the shared lock of the experiment folder ``root`` (keep it open while
    recording); None when ``root`` cannot be opened or a repair held the lock for ``wait`` seconds."""
    fd = _open(root)
    if fd is None:
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                if wait > 0:
                    warn("FL419", f"`flor verify --repair` held the lock of {root} for {wait:.0f} s: recording "
                         "without it (its blobs younger than the repair's grace period are kept in any case)")
                break
            time.sleep(0.1)
        except OSError:  # a filesystem without locks: nothing to hold
            break
    os.close(fd)
    return None


def exclusive(root: Path) -> int | None:
    """A descriptor holding the experiment folder's lock alone; None when a recording holds it
    (or the folder cannot be opened). Never waits."""
    fd = _open(root)
    if fd is None:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None


def release(fd: int | None) -> None:
    """Let the lock go (closing the descriptor); nothing for None."""
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
