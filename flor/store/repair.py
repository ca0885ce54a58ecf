"""Repair what ``flor.store.check`` found removable: ``flor verify --repair``.

Temp files of writers that died (``.tmp-*``, see ``flor.store.local.is_stale_tmp``) and blobs
that no manifest names, only inside ``objects/``. Orphans are kept when a manifest could not be
read (it might name them) or a recording is still running (its blobs are written before its
manifest), and those younger than a grace period whatever else; nothing is removed when a run
folder or manifest cannot be read by this user (FL418). The caller holds the store's lock alone
(``flor.store.lock``).
"""

from __future__ import annotations

import os
import time

from .._fmt import printable
from ..errors import FlorError
from ..findings import line
from .blobs import blob_key
from .check import StoreReport
from .experiment import ExperimentStore
from .ids import contained

__all__ = ["GRACE_S", "repair"]


#: a repair keeps unreferenced blobs younger than this (seconds): a recording's blobs come before
#: its manifest, and one that started without the store's lock (flor.store.lock) may be writing them
GRACE_S = 3600.0


def repair(store: ExperimentStore, report: StoreReport, *, dry_run: bool = False, grace: float = GRACE_S) -> list[str]:
    """Remove the leftover temp files and (when safe) the orphan blobs ``report`` found; return
    one line per file removed (with ``dry_run``: that would be). Only files inside the store
    are touched, blobs only inside ``objects/``, never through a symbolic link. Nothing at all
    when a run folder or manifest could not be read (FL418): they might name any blob. Orphan
    blobs younger than ``grace`` seconds are kept. Run it holding the store's lock alone
    (``flor.store.lock.exclusive``)."""
    done: list[str] = []
    if report.unreadable:
        return [line("FL418", f"repair refused: {len(report.unreadable)} run folder(s) or manifest(s) cannot be "
                              f"read ({printable(report.unreadable[0], newlines=False)}"
                              f"{', ...' if len(report.unreadable) > 1 else ''}) and may name any blob; "
                              "repair as a user who can read them")]
    verb = "would remove" if dry_run else "removed"
    for path in report.tmp_files:
        if not contained(path, store.root, parent_only=True):
            continue
        if not dry_run:
            try:
                path.unlink()
            except OSError as exc:
                done.append(f"could not remove {path}: {exc}")
                continue
        done.append(f"{verb} temp file {path.relative_to(store.root).as_posix()}")
    for folder in report.dead_starts:  # its temp files went above: only empty folders are removed
        if not contained(folder, store.root, parent_only=True) or folder.is_symlink():
            continue
        if not dry_run:
            try:
                for dirpath, _, _ in os.walk(folder, topdown=False):
                    os.rmdir(dirpath)
            except OSError as exc:
                done.append(f"could not remove {folder}: {exc}")
                continue
        done.append(f"{verb} run folder {folder.relative_to(store.root).as_posix()} "
                    "(a recording killed before it wrote run.json)")
    if report.orphans and report.keep_orphans:
        done.append(f"kept {len(report.orphans)} unreferenced blob(s): {report.keep_orphans}")
        return done
    young = 0
    now = time.time()
    for digest in report.orphans:
        key = blob_key(digest)  # valid hash: the path is objects/ab/cdef..., inside objects/
        try:
            if now - store.backend.path(key).lstat().st_mtime < grace:
                young += 1
                continue
        except OSError:
            continue
        if not dry_run:
            try:
                store.backend.delete(key)
            except FlorError as exc:
                done.append(f"could not remove {key}: {exc}")
                continue
        done.append(f"{verb} unreferenced blob {key}")
    if young:
        done.append(f"kept {young} unreferenced blob(s) younger than {grace:g} s (a recording may be writing them; "
                    "--grace 0 removes them too)")
    return done
