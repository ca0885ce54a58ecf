"""Export to TensorBoard: a new event file in the script's own logdir, at the steps its values belong to.

The logdir is the one given (``--logdir``), else the first ``SummaryWriter`` logdir the recording
noted. The event files already in that folder are read with TensorBoard's own reader; a point
whose (tag, step) one of them holds is not written again, so the export's file
(``events.out.tfevents.*.flor``, encoded like flor's own events: ``flor.logs.tensorboard``) only
ever adds what is missing.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, StorageError
from ..logs.tensorboard import EventFileWriter
from ..store.runmeta import RunMeta
from . import ExportResult, missing
from .points import Point

__all__ = ["export_tensorboard", "present_steps"]


def export_tensorboard(meta: RunMeta, points: list[Point], *, dry_run: bool = False,
                       logdir: str | Path | None = None) -> ExportResult:
    folder = _logdir(meta, logdir)
    taken = present_steps(folder)
    result = ExportResult("tensorboard", meta.run, str(folder), dry_run=dry_run).take(points, taken)
    if dry_run or not result.written:
        return result
    writer = EventFileWriter(folder, suffix=".flor")
    try:
        writer.add_scalars([(p.key, p.value, p.step, p.t) for p in result.written])
    except OSError as exc:
        raise StorageError(f"could not write TensorBoard events into {folder}: {exc}; free the disk or pass a "
                           "writable --logdir") from exc
    finally:
        writer.close()
    return result


def _logdir(meta: RunMeta, given: str | Path | None) -> Path:
    if given is not None:
        return Path(given).expanduser().absolute()
    note = meta.trackers.get("tensorboard") or {}
    logdirs = note.get("logdirs") if isinstance(note.get("logdirs"), list) else []
    if not logdirs or not isinstance(logdirs[0], str):
        raise ConfigError(f"run {meta.run} created no SummaryWriter that flor saw (none in the loop's variables); "
                          "name the folder to write the events into with --logdir DIR")
    return Path(logdirs[0])


def present_steps(folder: Path) -> set[tuple[str, int]]:
    """The (tag, step) of every scalar in the event files directly in ``folder``, read with TensorBoard's reader."""
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    except ImportError as exc:
        raise missing("tensorboard", "tensorboard") from exc
    out: set[tuple[str, int]] = set()
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*tfevents*")):
        if not path.is_file():
            continue
        try:
            for event in EventFileLoader(str(path)).Load():
                for value in event.summary.value:
                    out.add((value.tag, int(event.step)))
        except Exception as exc:
            raise StorageError(f"could not read the TensorBoard events in {path}: {exc}; move the damaged "
                               "file out of the logdir") from exc
    return out
