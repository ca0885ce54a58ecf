"""The log files of one run, found through its layout: read them all, or retire a replay
worker's earlier attempt."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import StorageError
from ..logs import occurrence_keys, read_jsonl
from .ids import contained
from .layout import RunLayout

__all__ = ["check_write_folders", "read_run_logs", "retire_worker_files"]


def read_run_logs(run_dir: Path, run: str, *, ranks: bool = False) -> list[dict]:
    """Every log record of one run: the recording's, then each replay's, worker by worker (so
    in epoch order: workers replay contiguous segments).

    With ``ranks``, a distributed recording's other ranks too (``logs/record-rank<R>.jsonl``),
    each record tagged with its ``rank`` (rank 0's are ``record.jsonl``'s).
    """
    layout = RunLayout(Path(run_dir))
    out: list[dict] = []
    if layout.record_log.is_file():
        for rec in read_jsonl(layout.record_log):
            out.append({**rec, "run": run, "source": "record", "replay": None, "worker": None,
                        **({"rank": 0} if ranks else {})})
    if ranks:
        for rank, path in layout.rank_logs():
            for rec in read_jsonl(path):
                out.append({**rec, "run": run, "source": "record", "replay": None, "worker": None, "rank": rank})
    for replay, worker, path in layout.replay_logs():
        for rec in read_jsonl(path):
            out.append({**rec, "run": run, "source": "replay", "replay": replay, "worker": worker})
    return occurrence_keys(out)


def check_write_folders(run_dir: Path, store_root: Path, replay: str) -> None:
    """Refuse (``StorageError``) a run whose folders a replay writes into lead out of the store
    through a symbolic link (``runs/<run>/logs -> /home/me``, planted in a shared store): the
    replay's logs, output, summary, TensorBoard events and earlier attempts would land there.
    Checked once, before the first write; each file is then opened without following a link
    (``flor._files.open_append``) or replaced atomically."""
    layout = RunLayout(Path(run_dir))
    for folder in (layout.root, layout.logs, layout.root / "tb", layout.tb_replay(replay), layout.root / "attempts"):
        if (folder.is_symlink() or folder == layout.root) and not contained(folder, store_root):
            raise StorageError(f"refusing to write into {folder}: it leads out of the store {store_root} through a "
                               f"symbolic link (to {folder.resolve()}); remove the link "
                               f"(`flor verify {Path(store_root).name}` lists such problems)")


def retire_worker_files(run_dir: Path, replay: str, worker: int) -> Path | None:
    """Move an earlier attempt of worker ``worker`` of ``replay`` out of the readers' way.

    A worker that runs again under the same replay id (``flor replay`` resuming after a
    failure, a requeued Slurm task, a restarted torchrun worker) starts clean: its earlier
    files go to ``runs/<run>/attempts/<replay>-<worker>-<n>/`` (kept for reading, never
    merged) and its TensorBoard file, derived from them, is deleted. Returns that folder,
    or None when there was nothing to move.
    """
    layout = RunLayout(Path(run_dir))
    # lexists: a link planted at one of them (dangling, so exists() is False) is moved aside too, not written through
    found = [p for p in layout.replay_files(replay, worker) if os.path.lexists(p)]
    tb = layout.tb_replay(replay)
    for e in sorted(tb.glob(f"events.out.tfevents.*.{worker}")) if tb.is_dir() else []:
        e.unlink(missing_ok=True)
    if not found:
        return None
    n = 0
    while layout.attempt(replay, worker, n).exists():
        n += 1
    dest = layout.attempt(replay, worker, n)
    dest.mkdir(parents=True)
    for p in found:
        p.replace(dest / p.name)
    return dest
