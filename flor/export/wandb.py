"""Export to W&B: the recorded run resumed (offline unless asked), each value against its flor step.

W&B keeps one step counter per run (``_step``) that only grows, and refuses to log at an earlier
one: values computed after the run ended cannot go "back" to their epochs on it. So every key flor
exports is declared with ``define_metric(key, step_metric="flor_step")`` and logged together with
``flor_step`` (the value's step, else its epoch): W&B's charts draw it against ``flor_step``, at
the epochs and steps it belongs to, whatever ``_step`` the resumed run is at.

A (key, step) the run already holds is not logged again: a row that carries ``flor_step`` (an
earlier export) holds its keys at that step, and so does a row the script logged with an
``epoch`` key (``wandb.log({"acc": acc, "epoch": epoch})``). Offline, the run's rows are read from
its files under the script's ``wandb/`` folder (each ``run-<id>.wandb``, decoded with W&B's own
record definitions, ``wandb.proto.wandb_internal_pb2.Record``); online, through ``wandb.Api``.
``wandb sync`` uploads an offline export like any offline run.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any, Iterator

from ..errors import ConfigError, StorageError
from ..store import ExperimentStore
from ..store.runmeta import RunMeta
from . import ExportResult, missing
from .points import Point

__all__ = ["STEP", "export_wandb", "history_rows", "present_steps"]

#: the step metric flor's exported values are declared against
STEP = "flor_step"


def export_wandb(store: ExperimentStore, meta: RunMeta, points: list[Point], *, dry_run: bool = False,
                 mode: str | None = None) -> ExportResult:
    try:
        import wandb
    except ImportError as exc:
        raise missing("wandb", "wandb") from exc
    note = meta.trackers.get("wandb") or {}
    run_id = note.get("id") if isinstance(note.get("id"), str) else None
    if run_id is None:
        raise ConfigError(f"run {meta.run} had no W&B run that flor saw (wandb.init before the loop ended); "
                          "export it to mlflow or tensorboard, or record with wandb.init in the script")
    mode = mode or os.environ.get("WANDB_MODE") or "offline"
    if mode not in ("offline", "online"):
        mode = "offline"  # a replay's WANDB_MODE=disabled would export nowhere
    folder = Path(str(note.get("dir") or meta.cwd or "."))
    project, entity = note.get("project"), note.get("entity")
    where = f"W&B run {'/'.join(str(x) for x in (entity, project, run_id) if x)} ({mode}, {folder})"
    taken = present_steps(folder, run_id) if mode == "offline" else _online_steps(wandb, entity, project, run_id)
    result = ExportResult("wandb", meta.run, where, dry_run=dry_run).take(points, taken)
    if dry_run or not result.written:
        return result
    try:
        chosen: Any = mode  # "offline" or "online", checked above
        init = getattr(wandb.init, "__wrapped__", wandb.init)  # a replay's --flor_export: not its quieted init
        run = init(project=project, entity=entity, id=run_id, resume="allow", mode=chosen, dir=str(folder),
                         settings=wandb.Settings(silent=True, console="off"))
        run.define_metric(STEP)
        for key in dict.fromkeys(p.key for p in result.written):
            run.define_metric(key, step_metric=STEP)
        rows: dict[int, dict[str, float]] = {}
        for p in result.written:
            rows.setdefault(p.step, {})[p.key] = p.value
        for step in sorted(rows):
            run.log({**rows[step], STEP: step})
        run.finish()
    except Exception as exc:
        raise StorageError(f"W&B refused the export of run {meta.run} into {where}: {exc}; check WANDB_MODE "
                           "and that the run exists") from exc
    return result


def present_steps(folder: Path, run_id: str) -> set[tuple[str, int]]:
    """The (key, step) the offline files of W&B run ``run_id`` under ``folder/wandb`` hold (see the module)."""
    out: set[tuple[str, int]] = set()
    for path in sorted((folder / "wandb").glob(f"*-{run_id}/run-{run_id}.wandb")):
        for row in history_rows(path):
            out |= _row_steps(row)
    return out


def _row_steps(row: dict[str, Any]) -> set[tuple[str, int]]:
    step = row.get(STEP, row.get("epoch"))
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not isinstance(step, int) or isinstance(step, bool):
        return set()
    return {(k, step) for k in row if not k.startswith("_") and k not in (STEP, "epoch")}


def _online_steps(wandb: Any, entity: str | None, project: str | None, run_id: str) -> set[tuple[str, int]]:
    path = "/".join(x for x in (entity, project, run_id) if x)
    try:
        rows = wandb.Api().run(path).scan_history()
        return set().union(*(_row_steps(dict(r)) for r in rows))
    except Exception as exc:
        raise StorageError(f"could not read W&B run {path} to skip what it holds: {exc}; check the "
                           "login (wandb login) and the run's path") from exc


# -- W&B's run files: a LevelDB-style log of W&B's own Record protocol buffers ----------------

_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version 0
_RECORD = struct.Struct("<IHB")  # CRC-32 of type and data, length, type (full, first, middle, last)
_BLOCK = 32768


def history_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The history rows (``wandb.log`` calls) of one ``run-<id>.wandb`` file, as dicts."""
    try:
        from wandb.proto import wandb_internal_pb2
    except ImportError as exc:
        raise missing("wandb", "wandb") from exc
    for data in _records(path):
        record = getattr(wandb_internal_pb2, "Record")()  # noqa: B009 - generated code mypy cannot see
        try:
            record.ParseFromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError: a damaged record is skipped
            continue
        if record.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in record.history.item:
            key = item.key or ".".join(item.nested_key)
            try:
                row[key] = json.loads(item.value_json)
            except ValueError:
                continue
        yield row


def _records(path: Path) -> Iterator[bytes]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StorageError(f"could not read W&B's run file {path}: {exc.strerror or exc}") from exc
    if len(data) < _HEADER.size or _HEADER.unpack_from(data)[0] != b":W&B":
        raise StorageError(f"{path} is not a W&B run file (no :W&B header); move it out of the wandb folder")
    at, parts = _HEADER.size, b""
    while at + _RECORD.size <= len(data):
        room = _BLOCK - at % _BLOCK
        if room < _RECORD.size:  # the rest of a block too short for a header is padding
            at += room
            continue
        crc, size, kind = _RECORD.unpack_from(data, at)
        body = data[at + _RECORD.size: at + _RECORD.size + size]
        at += _RECORD.size + size
        if len(body) < size or zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            return  # a torn end (a crash) or damage: what came before is sound
        if kind == 1:
            yield body
        elif kind == 2:
            parts = body
        elif kind == 3:
            parts += body
        elif kind == 4:
            yield parts + body
            parts = b""
