"""Check a whole experiment folder, byte by byte, and repair what can be repaired: ``flor verify``.

``check_experiment`` reads every ``run.json`` (through ``RunMeta.from_json``), every manifest
(through ``ExperimentStore.read_manifest``, the reader replay uses, so what it refuses is what
replay would refuse) and every blob: its bytes hash to its name, its size is the one the
manifest's dtype and shape give, and every blob a manifest names exists (or was evicted to
the run's spool). It also reports names that are not identifiers of their kind
(``flor.store.ids``) and symbolic links that lead out of the store. Nothing is changed.

``flor.store.repair`` removes what it found removable.

>>> import tempfile
>>> store = ExperimentStore(Path(tempfile.mkdtemp()), "demo")
>>> check_experiment(store).ok
True
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .._files import read_bytes
from .._fmt import printable
from ..errors import FlorError
from ..placement import pid_alive
from .blobs import blob_key
from .experiment import ExperimentStore, parse_checkpoint_key
from .hashing import hash_bytes
from .ids import contained, is_blob_hash, is_block_name, is_checkpoint_file, is_run_id
from .local import TMP_PREFIX, is_stale_tmp
from .manifest import TORCH_DTYPES

__all__ = ["StoreReport", "check_experiment"]


@dataclass
class StoreReport:
    """What ``check_experiment`` found: counts, problems (one line each) and what ``repair`` may remove."""

    root: Path
    runs: int = 0
    manifests: int = 0
    blobs: int = 0
    blob_bytes: int = 0
    evicted: int = 0  # named by a manifest, not local, and the run was spooled: fetched on replay
    problems: list[str] = field(default_factory=list)
    tmp_files: list[Path] = field(default_factory=list)  # leftovers of writers that died
    tmp_in_progress: int = 0  # temp files of live writers: left alone
    dead_starts: list[Path] = field(default_factory=list)  # run folders of recordings killed before their run.json
    orphans: list[str] = field(default_factory=list)  # blob hashes no manifest names
    keep_orphans: str | None = None  # why orphans must not be removed now, if they must not
    #: run folders, checkpoint folders and manifests this user cannot read: a repair then removes nothing
    #: (they might name any blob), and the check says so
    unreadable: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, path: Path | str, what: str) -> None:
        self.problems.append(f"{printable(self._rel(path), newlines=False)}: {what}")

    def _rel(self, path: Path | str) -> str:
        rel = Path(path)
        try:
            rel = rel.relative_to(self.root)
        except ValueError:
            pass
        return rel.as_posix()

    def cannot_read(self, path: Path | str, exc: OSError) -> None:
        """``path`` (a run folder, a checkpoint folder, a manifest) cannot be read by this user."""
        self.unreadable.append(self._rel(path))
        self.problem(path, f"cannot be read ({exc.strerror or exc}): it may name any blob, so a repair removes "
                           "nothing; run flor verify as a user who can read it (its owner, or with its mode fixed)")


def _listdir(path: Path, report: StoreReport) -> list[Path] | None:
    """The entries of a folder, sorted; None (reported) when it cannot be read."""
    try:
        return sorted(path.iterdir())
    except FileNotFoundError:
        return []
    except OSError as exc:
        report.cannot_read(path, exc)
        return None


def _expected_size(node: dict) -> int | None:
    """The byte size of a tensor or array leaf from its dtype and shape; None when unknown."""
    shape = node.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None
    dtype = node.get("dtype")
    itemsize = None
    if node.get("t") == "tensor" and isinstance(dtype, str):
        itemsize = TORCH_DTYPES.get(dtype.removeprefix("torch."))
    elif node.get("t") == "ndarray" and isinstance(dtype, str):
        import numpy as np

        try:
            itemsize = np.dtype(dtype).itemsize
        except (TypeError, ValueError):
            return None
    return None if itemsize is None else itemsize * math.prod(shape)


def _leaves(node: Any) -> Iterator[dict]:
    """Every dict of a manifest tree that names a blob (has an ``"h"``)."""
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            if "h" in cur:
                yield cur
            stack.extend(cur.values())
        elif isinstance(cur, list):
            stack.extend(cur)


def _running_here(meta: Any) -> bool:
    """Whether a run's recording process is alive on this host (or cannot be known dead)."""
    if meta.status != "running":
        return False
    host = (meta.versions or {}).get("host") if isinstance(meta.versions, dict) else None
    if host not in (None, socket.gethostname()):
        return meta.ended is None and time.time() - float(meta.started or 0) < 7 * 24 * 3600
    return isinstance(meta.pid, int) and pid_alive(meta.pid)


#: an empty run folder younger than this may be a recording between its mkdir and its first write
STARTING_S = 60.0


def _unstarted(entry: Path) -> str | None:
    """For a run folder without run.json: ``"dead"`` when it holds nothing but temp files of
    writers that died (or nothing at all, for a while): a recording killed before its first
    run.json was renamed into place, which ``flor ls`` and replay never list; ``"starting"``
    when a live writer's temp file is there or it is empty and new; None when it holds
    anything else (recorded data whose run.json is gone: a problem)."""
    now, live, files = time.time(), False, 0
    for dirpath, _, names in os.walk(entry):
        for name in names:
            files += 1
            if not name.startswith(TMP_PREFIX):
                return None
            try:
                age = now - (Path(dirpath) / name).lstat().st_mtime
            except OSError:
                continue
            live = live or not is_stale_tmp(name, age, pid_alive)
    if live:
        return "starting"
    if files:
        return "dead"
    try:
        return "dead" if now - entry.lstat().st_mtime > STARTING_S else "starting"
    except OSError:
        return "starting"


def _links_out(store: ExperimentStore, report: StoreReport) -> None:
    """Every symbolic link in the store that leads out of it (never followed)."""
    for dirpath, dirs, files in os.walk(store.root):
        for name in dirs + files:
            path = Path(dirpath) / name
            if path.is_symlink() and not contained(path, store.root):
                report.problem(path, f"a symbolic link leading out of the store (to {os.readlink(path)}); "
                                     "flor refuses to read or write through it: remove it")


class _Refs(dict):
    """``blob hash -> expected size`` (None: unknown) of the blobs the manifests name, and, for
    packs, the leaves said to lie inside: ``packed[hash] = {(offset, size, leaf hash,
    size from dtype and shape, manifest)}``."""

    def __init__(self) -> None:
        super().__init__()
        self.packed: dict[str, set] = {}


def _check_runs(store: ExperimentStore, selected: list[str] | None, report: StoreReport,
                refs: _Refs) -> None:
    base = store.root / "runs"
    entries = (_listdir(base, report) or []) if base.is_dir() else []
    for entry in entries:
        run = entry.name
        if selected is not None and run not in selected:
            continue
        if not is_run_id(run):
            report.problem(entry, "not a run id; flor ignores it")
            continue
        if entry.is_symlink() and not contained(entry, store.root):
            continue  # reported by _links_out
        if not entry.is_dir():
            report.problem(entry, "not a folder; flor ignores it")
            continue
        if _listdir(entry, report) is None:  # lexists() below would say "no run.json", and its blobs look unnamed
            report.runs += 1
            continue
        meta = None
        if not os.path.lexists(entry / "run.json"):
            start = _unstarted(entry)
            if start == "dead":
                report.dead_starts.append(entry)
                continue
            if start == "starting":
                continue  # a recording writing its first run.json now
        report.runs += 1
        if not (entry / "run.json").is_file():
            report.problem(entry / "run.json", "missing: the run cannot be listed or replayed")
        else:
            try:
                meta = store.read_run(run)
            except FlorError as exc:
                report.problem(entry / "run.json", str(exc))
            except Exception as exc:  # noqa: BLE001 - verify reports damage, whatever shape it takes
                report.problem(entry / "run.json", f"unreadable ({type(exc).__name__}: {exc})")
        if meta is not None and _running_here(meta):
            report.keep_orphans = f"run {run} is still recording (its blobs are written before its manifests)"
        _check_manifests(store, run, meta, report, refs)


def _check_manifests(store: ExperimentStore, run: str, meta: Any, report: StoreReport,
                     refs: _Refs) -> None:
    base = store.run_path(run, "checkpoints")
    if not base.is_dir():
        return
    spooled = bool(meta is not None and meta.spool)
    for block_dir in _listdir(base, report) or []:
        if not is_block_name(block_dir.name) or not block_dir.is_dir():
            report.problem(block_dir, "not a SkipBlock folder name; flor ignores it")
            continue
        for f in _listdir(block_dir, report) or []:
            if f.name.startswith(TMP_PREFIX):
                continue  # counted with the temp files
            if not is_checkpoint_file(f.name):
                report.problem(f, "not a checkpoint file name; flor ignores it")
                continue
            report.manifests += 1
            epoch, occ = parse_checkpoint_key(f.name[: -len(".json")])
            try:
                manifest = store.read_manifest(run, block_dir.name, epoch, occ)
            except FlorError as exc:
                if isinstance(exc.__cause__, PermissionError):
                    report.cannot_read(f, exc.__cause__)
                    continue
                report.problem(f, str(exc))
                report.keep_orphans = report.keep_orphans or f"{f.relative_to(store.root)} cannot be read"
                continue
            except PermissionError as exc:
                report.cannot_read(f, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - verify reports damage, whatever shape it takes
                report.problem(f, f"unreadable ({type(exc).__name__}: {exc})")
                report.keep_orphans = report.keep_orphans or f"{f.relative_to(store.root)} cannot be read"
                continue
            for leaf in _leaves(manifest):
                digest = leaf.get("h")
                if not is_blob_hash(digest):
                    report.problem(f, f"names an invalid blob hash {digest!r:.80}; the checkpoint is unusable")
                    continue
                size = _expected_size(leaf)
                if "o" in leaf:  # a small leaf inside a pack: its bytes are a slice of the blob
                    refs.setdefault(digest, None)
                    refs.packed.setdefault(digest, set()).add((leaf["o"], leaf["n"], leaf["x"], size, f.name))
                elif refs.get(digest) is None:
                    refs[digest] = size
                if not store.backend.path(blob_key(digest)).exists():
                    if spooled:
                        report.evicted += 1
                    else:
                        report.problem(f, f"names blob {digest}, which is missing; the checkpoint is unusable")


def _check_blobs(store: ExperimentStore, report: StoreReport, refs: _Refs, *,
                 all_runs: bool) -> None:
    """Hash every local blob (all of them, or with ``--run`` those its manifests name)."""
    base = store.root / "objects"
    if not base.is_dir():
        return
    for sub in sorted(os.scandir(base), key=lambda e: e.name):
        if sub.name.startswith(TMP_PREFIX):
            continue
        if not sub.is_dir(follow_symlinks=False):
            if not sub.is_symlink():
                report.problem(sub.path, "a stray file among the blob folders")
            continue
        try:
            blobs = sorted(os.scandir(sub.path), key=lambda e: e.name)
        except OSError as exc:
            report.cannot_read(sub.path, exc)
            continue
        for f in blobs:
            if f.name.startswith(TMP_PREFIX):
                continue
            digest = sub.name + f.name
            if len(sub.name) != 2 or not is_blob_hash(digest) or not f.is_file(follow_symlinks=False):
                if not f.is_symlink():
                    report.problem(f.path, "not a blob (its name is not a blob hash)")
                continue
            if not all_runs and digest not in refs:
                continue
            if digest not in refs:
                report.orphans.append(digest)
            try:
                data = read_bytes(f.path, limit=None)  # a regular file, no link followed (no race with the check)
            except OSError as exc:
                report.problem(f.path, f"unreadable: {exc}")
                continue
            report.blobs += 1
            report.blob_bytes += len(data)
            actual = hash_bytes(data)
            if actual != digest:
                report.problem(f.path, f"corrupt: its bytes hash to {actual}; checkpoints naming it are unusable")
                continue
            if refs.get(digest) is not None and refs[digest] != len(data):
                report.problem(f.path, f"{len(data)} bytes, but its manifest's dtype and shape make {refs[digest]}")
            for off, n, leaf_hash, size, manifest in sorted(refs.packed.get(digest, ())):
                if off + n > len(data) or hash_bytes(data[off:off + n]) != leaf_hash or size not in (None, n):
                    report.problem(f.path, f"a pack whose bytes {off}-{off + n} are not the leaf {manifest} "
                                           "names there; that checkpoint is unusable")


def _tmp_files(store: ExperimentStore, report: StoreReport) -> None:
    now = time.time()
    for dirpath, _, files in os.walk(store.root):
        for name in files:
            if not name.startswith(TMP_PREFIX):
                continue
            path = Path(dirpath) / name
            try:
                age = now - path.lstat().st_mtime
            except OSError:
                continue
            if is_stale_tmp(name, age, pid_alive):
                report.tmp_files.append(path)
            else:
                report.tmp_in_progress += 1


def check_experiment(store: ExperimentStore, runs: list[str] | None = None) -> StoreReport:
    """Check ``store`` (or only ``runs`` of it: their run.json, manifests and the blobs those
    name); change nothing. Orphan blobs are found only when every run is checked."""
    report = StoreReport(store.root)
    if not store.root.is_dir():
        return report
    refs = _Refs()
    _links_out(store, report)
    _check_runs(store, runs, report, refs)
    _check_blobs(store, report, refs, all_runs=runs is None)
    _tmp_files(store, report)
    return report
