"""The values flor holds for a run, as points a tracker takes: ``(key, value, step)``.

Every value the recording and its replays logged, one per ``record_key`` (a replay's value over
the recording's: ``flor.logs.merge_newest``), numbers and bools only (a tracker's metric is a
number). ``step`` is the value's own step when it was logged with a whole one, else its epoch
(0 before ``flor.it``'s loop, the number of epochs after it): the x-axis flor's own TensorBoard
events use (``flor.logs.tensorboard.global_step``). A tracker keeps one value per (key, step):
where flor holds several (a name logged twice in an epoch without a step), the first is exported
and the others are counted as ``collapsed``.
"""

from __future__ import annotations

from typing import NamedTuple

from ..logs import merge_newest, record_key
from ..logs.tensorboard import global_step, scalar_value
from ..store import ExperimentStore
from ..store.runlogs import read_run_logs

__all__ = ["Point", "points_of"]


class Point(NamedTuple):
    key: str
    value: float
    step: int
    epoch: int | None
    hindsight: bool  # a replay logged it; the recording did not
    t: float  # when it was logged (Unix seconds)


def points_of(store: ExperimentStore, run: str, *, prefix: str = "") -> tuple[list[Point], int]:
    """The run's points in logging order, and how many values were collapsed onto a (key, step) already taken."""
    epochs = int(store.read_run(run).epochs_done or 0)
    logged = read_run_logs(store.run_path(run), run)
    recorded = {record_key(r) for r in logged if r["source"] == "record"}
    out: list[Point] = []
    taken: set[tuple[str, int]] = set()
    collapsed = 0
    for rec in merge_newest(logged):
        value, step = scalar_value(rec.get("value")), global_step(rec, epochs)
        if value is None or step is None:
            continue
        key = prefix + str(rec["name"])
        if (key, step) in taken:
            collapsed += 1
            continue
        taken.add((key, step))
        hindsight = rec["source"] == "replay" and record_key(rec) not in recorded
        out.append(Point(key, value, step, rec.get("epoch"), hindsight, float(rec.get("t") or 0.0)))
    return out, collapsed
