"""Files the script writes itself (``torch.save(checkpoint, "ckpt.pt")``, ``open(..., "w")``, a
plot): noted while recording (run.json ``files_written``), named once per file when a replay
writes one of them again.

A replay re-executes the script's code around the blocks, and the blocks it cannot restore: an
unguarded ``torch.save`` of the best model then overwrites what the recording left with a value
of the replay's own order (a segment worker's last epoch, not the recorded best), and the workers
of one launch all write the same path. flor cannot tell a side effect from a wanted output, so it
does not stop the write; it says which file and how to guard it (``flor.replaying()``).

Writes are seen through a Python audit hook on ``open`` (``sys.addaudithook``: builtins.open,
io.open, os.open and what uses them: numpy.save, matplotlib's savefig), and through ``torch.save``,
which opens a path in C++ (wrapped while the session lasts); the files of flor's store and config
folder are left out. An audit hook cannot be removed: a closed session's hook does nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = ["FileWrites", "MOST", "recorded_writes"]

#: the most paths a recording notes
MOST = 64
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


class FileWrites:
    """The paths the script opens for writing outside ``skip`` (folders): kept in ``paths`` (at most
    ``MOST``), and ``seen(path)`` called once for each of ``watched`` the script writes."""

    def __init__(self, skip: Iterable[Path], watched: Iterable[str] = (),
                 seen: Callable[[str], None] | None = None) -> None:
        self.skip = tuple(os.path.join(os.path.abspath(p), "") for p in skip)
        self.paths: list[str] = []
        self.watched = set(watched)
        self.told: set[str] = set()
        self.seen = seen
        self.active = True
        self._inside = False
        sys.addaudithook(self._hook)
        self._torch_save: Any = None
        torch: Any = sys.modules.get("torch")
        if torch is not None and callable(getattr(torch, "save", None)):
            self._torch_save = original = torch.save

            def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
                if isinstance(f, (str, os.PathLike)):
                    self._hook("open", (f, "wb", None))
                return original(obj, f, *args, **kwargs)

            save.__wrapped__ = original  # type: ignore[attr-defined]
            save.__doc__ = original.__doc__
            torch.save = save

    def close(self) -> None:
        self.active = False
        torch: Any = sys.modules.get("torch")
        if self._torch_save is not None and torch is not None and getattr(torch.save, "__wrapped__", None) \
                is self._torch_save:
            torch.save = self._torch_save
        self._torch_save = None

    def _hook(self, event: str, args: tuple) -> None:
        if event != "open" or not self.active or self._inside:
            return
        self._inside = True
        try:
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            if isinstance(path, bytes):
                path = os.fsdecode(path)
            if not isinstance(path, (str, os.PathLike)) or not _writes(mode, flags):
                return
            full = os.path.abspath(os.fspath(path))
            if full.startswith(self.skip) or full.startswith("/dev/") or full.startswith("/proc/"):
                return
            if full not in self.paths and len(self.paths) < MOST:
                self.paths.append(full)
            if full in self.watched and full not in self.told and self.seen is not None:
                self.told.add(full)
                self.seen(full)
        except Exception:  # noqa: BLE001 - an audit hook must never break the script's open()
            pass
        finally:
            self._inside = False


def recorded_writes(extra: dict[str, Any]) -> list[str]:
    """run.json's ``files_written`` (read from a store: strings only, at most ``MOST``)."""
    found = extra.get("files_written")
    return [p for p in found[:MOST] if isinstance(p, str)] if isinstance(found, list) else []
