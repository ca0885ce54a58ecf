"""Compare runs grouped by hyperparameters: n, mean ± sample std, min and max per group, ranked.

Each run contributes one number: the metric's value at its last logged epoch (``at="final"``),
its best value (``"best"``) or its value at a given epoch (an int), where a replay's value
replaces the recorded one. Runs are grouped by the values of the ``by`` hyperparameters
(from ``run.json``; seeds are what varies inside a group), and groups are ranked by their
mean, best first.

(needs the recorded experiment ``cnn-sweep``, so the example is not run as a doctest)

>>> c = compare(["cnn-sweep"], by=["lr"], metric="val_acc")  # doctest: +SKIP
>>> [(g.key, g.n, round(g.mean, 4)) for g in c.groups]  # doctest: +SKIP
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError, StorageError
from ..store.experiment import open_experiment
from .frame import hyperparameters, records
from ..logs.summary import goal_of, number

__all__ = ["Comparison", "Group", "RunResult", "compare", "describe", "render", "series_of"]


@dataclass
class RunResult:
    """One run's share of a comparison."""

    experiment: str
    run: str
    hparams: dict[str, Any]
    value: float
    epoch: int | None
    series: list[tuple[float, float]]  # (x, value), x = epoch (or step), for plots
    hindsight: bool


@dataclass
class Group:
    key: tuple
    runs: list[RunResult]
    rank: int = 0

    @property
    def values(self) -> list[float]:
        return [r.value for r in self.runs]

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        """Sample standard deviation (n - 1 in the denominator); None for a single run."""
        return statistics.stdev(self.values) if self.n > 1 else None

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)


@dataclass
class Comparison:
    metric: str
    by: list[str]
    at: str | int
    goal: str
    x: str
    groups: list[Group]
    excluded: list[tuple[str, str]] = field(default_factory=list)  # (run, why)


def series_of(recs: list[dict], x: str) -> list[tuple[float, float, int | None, bool]]:
    """``(x, value, epoch, hindsight)`` of numeric values logged in the loop, by x."""
    out = []
    by_epoch: dict[Any, int] = {}
    inside = [r for r in recs if r.get("epoch") is not None and number(r.get("value")) is not None]
    for r in inside:
        by_epoch[r["epoch"]] = by_epoch.get(r["epoch"], 0) + 1
    seen: dict[Any, int] = {}
    for r in inside:
        if x == "step":
            step = r.get("step")
            if not isinstance(step, (int, float)) or isinstance(step, bool):
                continue
            pos = float(step)
        else:
            # several values in one epoch (per-batch logs) spread over that epoch
            i = seen.get(r["epoch"], 0)
            seen[r["epoch"]] = i + 1
            pos = r["epoch"] + (i / by_epoch[r["epoch"]] if by_epoch[r["epoch"]] > 1 else 0.0)
        out.append((pos, float(r["value"]), r["epoch"], bool(r.get("hindsight"))))
    out.sort(key=lambda p: p[0])
    return out


def _pick(series: list[tuple[float, float, int | None, bool]], at: str | int,
          goal: str) -> tuple[float, int | None] | None:
    if not series:
        return None
    if at == "final":
        return series[-1][1], series[-1][2]
    if at == "best":
        best = (min if goal == "min" else max)(series, key=lambda p: p[1])
        return best[1], best[2]
    if isinstance(at, str):  # a word other than final or best: no epoch is one
        return None
    in_epoch = [p for p in series if p[2] == at]
    return (in_epoch[-1][1], at) if in_epoch else None


def compare(names: Sequence[str], *, by: Sequence[str], metric: str, at: str | int = "final",
            goal: str | None = None, runs: Sequence[str] | None = None, x: str = "epoch",
            home: Path | None = None, definitions: Any = None, unfinished: bool = False) -> Comparison:
    """Group the runs of the experiments ``names`` by the hyperparameters ``by``; see the module docstring.

    ``runs`` restricts each experiment to those run ids (or prefixes); by default every run
    that finished is used (``unfinished=True`` also takes crashed and running ones).
    """
    if not names:
        raise ConfigError("name at least one experiment to compare")
    if not by:
        raise ConfigError("group by at least one hyperparameter, e.g. --by lr")
    if isinstance(at, str) and at not in ("final", "best"):
        raise ConfigError(f"--at {at!r}: use final, best or an epoch number")
    goal = goal or goal_of(metric)
    if goal not in ("min", "max"):
        raise ConfigError(f"--goal {goal!r}: use min or max")
    results: list[RunResult] = []
    excluded: list[tuple[str, str]] = []
    known_hp: set[str] = set()
    known_names: set[str] = set()
    for name in names:
        store = open_experiment(name, home)
        chosen = store.runs() if not runs else [r for r in store.runs() if any(r.startswith(p) for p in runs)]
        if runs and not chosen:
            raise ConfigError(f"none of the runs {list(runs)} is in {name}; `flor ls {name}` lists them")
        if runs and len(chosen) == 1:
            store.read_run(chosen[0])  # the one run named: a damaged one is the error
        # among several, a damaged run is left out with a warning, not the comparison
        chosen = store.readable_runs(chosen)
        if not chosen:
            raise StorageError(f"no run of {name} to compare can be read: each run.json is damaged (named above); "
                               f"`flor verify {name}` lists every problem")
        merged = records(name, run=chosen, home=home, newest=True, definitions=definitions)
        for run in chosen:
            meta = store.read_run(run)
            hp = hyperparameters(store, run)
            known_hp.update(hp)
            mine = [r for r in merged if r["run"] == run]
            known_names.update(r["name"] for r in mine)
            if not unfinished and meta.status != "finished":
                excluded.append((run, f"status {meta.status_text()}"))
                continue
            recs = [r for r in mine if r["name"] == metric]
            picked = _pick(series_of(recs, "epoch"), at, goal)
            if picked is None:
                excluded.append((run, f"no {metric}" + ("" if isinstance(at, str) else f" at epoch {at}")))
                continue
            results.append(RunResult(name, run, hp, picked[0], picked[1],
                                     [(p[0], p[1]) for p in series_of(recs, x)],
                                     any(r.get("hindsight") for r in recs)))
    missing = [h for h in by if h not in known_hp]
    if missing:
        raise ConfigError(f"no run of {', '.join(names)} has the hyperparameter {missing[0]!r}; "
                          f"the runs have: {', '.join(sorted(known_hp)) or 'none (record with argparse or flor.arg)'}")
    if metric not in known_names:
        raise ConfigError(f"no run of {', '.join(names)} logged {metric!r}; the logged names are: "
                          f"{', '.join(sorted(known_names)) or 'none'}")
    if not results:
        why = "; ".join(sorted({w for _, w in excluded})) or "no runs"
        raise ConfigError(f"no run of {', '.join(names)} can be compared on {metric}: {why}"
                          + ("" if unfinished else " (--unfinished also takes crashed and running runs)"))
    groups: dict[tuple, Group] = {}
    for r in results:
        key = tuple(_hashable(r.hparams.get(h)) for h in by)
        groups.setdefault(key, Group(key, [])).runs.append(r)
    ranked = sorted(groups.values(), key=lambda g: g.mean, reverse=goal == "max")
    for i, g in enumerate(ranked, 1):
        g.rank = i
    return Comparison(metric, list(by), at, goal, x, ranked, excluded)


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return f"{x:.5g}" if isinstance(x, float) else str(x)


def describe(c: Comparison) -> str:
    what = {"final": "final value", "best": "best value"}[c.at] if isinstance(c.at, str) else f"value at epoch {c.at}"
    better = "higher" if c.goal == "max" else "lower"
    n = sum(g.n for g in c.groups)
    return f"{c.metric}: {what} of each run, grouped by {', '.join(c.by)} ({better} is better); {n} runs"


def table_rows(c: Comparison) -> list[dict[str, Any]]:
    """One dict per group: rank, the ``by`` values, n, mean, std, min, max, runs."""
    return [{"rank": g.rank, **dict(zip(c.by, g.key)), "n": g.n, "mean": g.mean, "std": g.std,
             "min": g.min, "max": g.max, "runs": " ".join(r.run for r in g.runs)} for g in c.groups]


def render(c: Comparison) -> str:
    """The comparison as an aligned text table, with a line about excluded runs."""
    head = ["rank", *c.by, "n", "mean ± std", "min", "max"]
    body = [[str(g.rank), *(fmt(v) if not isinstance(v, str) else v for v in g.key), str(g.n),
             f"{fmt(g.mean)} ± {fmt(g.std)}", fmt(g.min), fmt(g.max)] for g in c.groups]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = [describe(c)]
    for row in [head, *body]:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if c.excluded:
        shown = ", ".join(f"{run} ({why})" for run, why in c.excluded[:5])
        more = f" and {len(c.excluded) - 5} more" if len(c.excluded) > 5 else ""
        lines.append(f"left out: {shown}{more}")
    return "\n".join(lines)
