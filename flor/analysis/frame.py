"""Log records of an experiment's runs, as lists of dicts, wide tables or a pandas DataFrame.

Values are indexed by run, epoch and step, never by wall-clock time, and never
downsampled. Where a replay logged a value the recording also has (same name, epoch, step
and occurrence), the newest replay's value is the one shown; values only a replay has are
*hindsight* values.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from .._files import read_text
from ..errors import ConfigError
from ..logs import merge_newest, record_key, step_key
from ..store.runlogs import read_run_logs
from ..store import ExperimentStore
from ..store.experiment import open_experiment

__all__ = ["dataframe", "hyperparameters", "mark_hindsight", "records", "script_versions", "wide"]

def hyperparameters(store: ExperimentStore, run: str) -> dict[str, Any]:
    """The hyperparameters a run recorded (its argparse namespace and ``flor.arg`` values)."""
    return dict(store.read_run(run).hyperparameters)


def records(name: str | None = None, *, run: str | Sequence[str] | None = None, home: Path | None = None,
            newest: bool = False, definitions: Any = None) -> list[dict]:
    """Log records of one run (default the latest), of several, or of every run (``run="all"``).

    Each record has ``run, source, replay, worker, epoch, step, name, value, block``. With
    ``newest`` only one value per run, name, epoch and step is kept: the newest replay's,
    else the recording's. ``definitions`` (see ``flor.analysis.metrics.load_definitions``)
    adds the metrics that regexes find in the printed output.
    """
    store = open_experiment(name, home)
    out: list[dict] = []
    defs = None
    if definitions is not None:
        from .metrics import load_definitions

        defs = load_definitions(definitions)
    for r in store.select_runs(run):
        logged = script_versions(store, r, read_run_logs(store.run_path(r), r))
        out.extend(logged)
        if defs:
            from .metrics import extract

            clash = {d.name for d in defs} & {x["name"] for x in logged}
            if clash:
                raise ConfigError(
                    f"metric definition {sorted(clash)[0]!r} has the name of a value run {r} logged with "
                    "flor.log; give the regex metric another name"
                )
            out.extend(extract(store.run_path(r), r, defs))
    return mark_hindsight(merge_newest(out), out) if newest else out


def script_versions(store: ExperimentStore, run: str, logged: list[dict]) -> list[dict]:
    """Set ``script`` on each record: sha256[:12] of the script version that logged it (the
    recording's ``script_sha256``; a replay worker's own, from its summary: today's script, or
    the run's older source with today's logging, ``flor replay --all``). None where unknown."""
    layout = store.layout(run)
    recorded = (store.read_run(run).script_sha256 or "")[:12] or None
    replayed: dict[tuple, str | None] = {}
    for rec in logged:
        if rec["source"] != "replay":
            rec["script"] = recorded
            continue
        key = (rec["replay"], rec["worker"])
        if key not in replayed:
            try:
                digest = json.loads(read_text(layout.replay_summary(*key))).get("script_sha256")
            except (OSError, ValueError, AttributeError, RecursionError):
                digest = None
            replayed[key] = digest[:12] if isinstance(digest, str) else None
        rec["script"] = replayed[key]
    return logged


def mark_hindsight(merged: list[dict], everything: Iterable[dict] | None = None) -> list[dict]:
    """Set ``hindsight`` on merged records: True for a replay's value the recording lacks.

    The recording's keys come from ``everything``, the records before merging (default:
    ``merged`` itself, which only holds recorded values no replay replaced)."""
    recorded = {record_key(r) for r in (everything if everything is not None else merged) if r["source"] == "record"}
    for rec in merged:
        rec["hindsight"] = rec["source"] == "replay" and record_key(rec) not in recorded
    return merged


_LOOP_RANK = {"before": 0, None: 1, "after": 2}


def _step_order(step: Any) -> tuple:
    if step is None:
        return (0, 0)
    if isinstance(step, (int, float)) and not isinstance(step, bool):
        return (1, step)
    return (2, str(step))


def wide(merged: list[dict], hparams: dict[str, dict[str, Any]] | None = None,
         names: Sequence[str] = (), *, script: bool = False) -> tuple[list[str], list[dict], set[str]]:
    """One row per (run, epoch, step, occurrence), one column per hyperparameter and per name.

    Returns ``(columns, rows, hindsight_columns)``. Hyperparameter columns come first; one
    whose name is also a logged name is called ``hp.NAME``, and a value logged as ``run``,
    ``epoch`` or ``step`` is called ``log.NAME``. Epochs of values logged outside the loop
    read ``before`` or ``after``. With ``script``, a last column ``script`` names the script
    version(s) the row's values came from (``script_versions``; several joined by ``+``).
    """
    hparams = hparams or {}
    metric_names = list(names) or list(dict.fromkeys(r["name"] for r in merged))
    wanted = set(metric_names)
    hp_names = list(dict.fromkeys(k for run in hparams.values() for k in run))
    fixed = {"run", "epoch", "step"}
    hp_cols = {h: (f"hp.{h}" if h in wanted or h in fixed else h) for h in hp_names}
    # a value logged under an index column's name (flor.log("step", step)) is "log.step"
    cols = {m: (f"log.{m}" if m in fixed else m) for m in metric_names}
    rows: dict[tuple, dict[str, Any]] = {}
    order: dict[tuple, tuple] = {}
    hindsight: set[str] = set()
    run_order = {r: i for i, r in enumerate(dict.fromkeys(x["run"] for x in merged))}
    for rec in merged:
        if rec["name"] not in wanted:
            continue
        step = rec.get("step")
        key = (rec["run"], rec.get("loop"), rec.get("epoch"), step_key(step), rec.get("k", 0))
        row = rows.get(key)
        if row is None:
            epoch = rec.get("epoch") if rec.get("epoch") is not None else rec.get("loop")
            row = rows[key] = {"run": rec["run"], **{hp_cols[h]: hparams.get(rec["run"], {}).get(h) for h in hp_names},
                               "epoch": epoch, "step": step}
            epoch_rank = rec.get("epoch") if rec.get("epoch") is not None else -1
            order[key] = (run_order[rec["run"]], _LOOP_RANK.get(rec.get("loop"), 1), epoch_rank, _step_order(step),
                          rec.get("k", 0))
        row[cols[rec["name"]]] = rec["value"]
        if script:
            row.setdefault("script", [])
            if rec.get("script") not in row["script"]:
                row["script"].append(rec.get("script"))
        if rec.get("hindsight"):
            hindsight.add(cols[rec["name"]])
    ordered = [rows[k] for k in sorted(rows, key=order.__getitem__)]
    columns = ["run", *hp_cols.values(), "epoch", "step", *cols.values()]
    if script:
        for row in ordered:
            row["script"] = "+".join(str(x) for x in row.get("script", []))
        columns.append("script")
    return columns, ordered, hindsight


def dataframe(*names: str, name: str | None = None, run: str | Sequence[str] | None = "all",
              home: Path | None = None, hparams: bool = False, definitions: Any = None) -> Any:
    """One row per (run, epoch, step) and one column per logged name; hindsight values from
    the newest replay take the place of recorded ones.

    ``hparams=True`` adds a column per hyperparameter (``hp.NAME`` where a logged value has
    the same name); the last column, ``script``, is sha256[:12] of the script version the row's
    values came from (``flor replay --all`` replays older runs with their own script); ``definitions`` adds
    regex metrics from the printed output.

    (needs the recorded experiment ``cnn-demo``, so the example is not run as a doctest)

    >>> flor.dataframe("val_acc", "weight_norm", name="cnn-demo", hparams=True)  # doctest: +SKIP
    """
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("flor.dataframe needs pandas: pip install pandas"
                          " (or pip install -e '.[pandas]' in flor's checkout)") from exc
    merged = records(name, run=run, home=home, newest=True, definitions=definitions)
    hp = {}
    if hparams:
        store = open_experiment(name, home)
        hp = {r: hyperparameters(store, r) for r in dict.fromkeys(x["run"] for x in merged)}
    columns, rows, _ = wide(merged, hp, names, script=True)
    for row in rows:
        if isinstance(row["epoch"], str):
            row["epoch"] = None  # before/after the loop: no epoch
    frame = pd.DataFrame(rows, columns=columns)
    return frame.astype({"epoch": "Int64"}) if len(frame) else frame
