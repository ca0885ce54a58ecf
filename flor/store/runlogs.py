"""The log files of one run, found through its layout: read them all, or retire a replay
worker's earlier attempt."""

from __future__ import annotations

from pathlib import Path

from ..logs import occurrence_keys, read_jsonl
from .layout import RunLayout

__all__ = ["read_run_logs", "retire_worker_files"]


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


def retire_worker_files(run_dir: Path, replay: str, worker: int) -> Path | None:
    """Move an earlier attempt of worker ``worker`` of ``replay`` out of the readers' way.

    A worker that runs again under the same replay id (``flor replay`` resuming after a
    failure, a requeued Slurm task, a restarted torchrun worker) starts clean: its earlier
    files go to ``runs/<run>/attempts/<replay>-<worker>-<n>/`` (kept for reading, never
    merged) and its TensorBoard file, derived from them, is deleted. Returns that folder,
    or None when there was nothing to move.
    """
    layout = RunLayout(Path(run_dir))
    found = [p for p in layout.replay_files(replay, worker) if p.exists()]
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
