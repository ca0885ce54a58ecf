"""Log records of an experiment's runs, as lists of dicts or a pandas DataFrame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError, ReplayError
from ..logs import merge_newest, read_run_logs
from ..settings import SETTINGS, validate_name
from ..store import ExperimentStore

__all__ = ["dataframe", "records"]


def open_experiment(name: str | None, home: Path | None = None) -> ExperimentStore:
    name = name or SETTINGS.name
    if name is None:
        raise ConfigError("no experiment named: pass name=NAME (the NAME given to --flor)")
    store = ExperimentStore(home or SETTINGS.home, validate_name(name))
    if not store.runs():
        raise ReplayError(f"no experiment {name!r} under {store.root.parent}; `flor ls` lists them")
    return store


def records(name: str | None = None, *, run: str | None = None, home: Path | None = None,
            newest: bool = False) -> list[dict]:
    """Log records of one run (default the latest) or of every run (``run="all"``).

    Each record has ``run, source, replay, worker, epoch, step, name, value, block``. With
    ``newest`` only one value per run, name, epoch and step is kept: the newest replay's,
    else the recording's.
    """
    store = open_experiment(name, home)
    runs = store.runs() if run == "all" else [store.resolve_run(run)]
    out: list[dict] = []
    for r in runs:
        out.extend(read_run_logs(store.run_path(r), r))
    return merge_newest(out) if newest else out


def dataframe(*names: str, name: str | None = None, run: str | None = "all", home: Path | None = None) -> Any:
    """One row per (run, epoch, step) and one column per logged name; hindsight values from
    the newest replay take the place of recorded ones.

    >>> flor.dataframe("val_acc", "weight_norm", name="cnn-demo")  # doctest: +SKIP
    """
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("flor.dataframe needs pandas: pip install 'flor[pandas]'") from exc
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in records(name, run=run, home=home, newest=True):
        if names and rec["name"] not in names:
            continue
        key = (rec["run"], rec.get("epoch"), rec.get("step"), rec.get("k", 0))
        row = rows.setdefault(key, {"run": key[0], "epoch": key[1], "step": key[2]})
        row[rec["name"]] = rec["value"]
    columns = ["run", "epoch", "step", *(names or sorted({c for r in rows.values() for c in r} - {"run", "epoch", "step"}))]
    frame = pd.DataFrame(list(rows.values()), columns=columns)
    return frame.astype({"epoch": "Int64"}) if len(frame) else frame
