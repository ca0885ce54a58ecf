"""Metrics from printed output, with regex definitions in SageMaker's ``{Name, Regex}`` form.

A recording's output is in ``runs/<run>/stdout.log`` and each replay worker's in
``runs/<run>/replay-<replay-id>-<worker>.log``; a side file ``*.marks.jsonl`` notes the byte
offset where each epoch starts, so every printed line has an epoch. Each definition's regex
is searched in every line (split at ``\\n`` and ``\\r``, so progress bars count too); the
first match's group 1, read as a number (``0.25``, ``-3``, ``4.9e-05``, ``nan``), becomes a
value named ``Name`` at that line's epoch: an ordinary log record, so scripts that only
``print`` get curves, and ``print`` statements added for a replay are hindsight values like
``flor.log``.

Which lines count mirrors ``flor.log`` in replay: lines printed during a replay worker's
initialization epochs are left out, lines before the loop only from worker 0 and after it
only from the last worker.

>>> defs = load_definitions('[{"Name": "loss", "Regex": "loss[=:] *([-+0-9.eE]+|nan)"}]')
>>> [(d.name, d.value_in("epoch 3 loss: 4.9e-05")) for d in defs]
[('loss', 4.9e-05)]
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .._files import MAX_OUTPUT, StoreFileError, read_bytes, read_text
from ..errors import ConfigError, warn
from ..logs import occurrence_keys
from ..store.layout import RunLayout

__all__ = [
    "MAX_DEFINITIONS", "MetricDefinition", "analytics", "analytics_frame", "extract", "load_definitions", "output_logs",
    "printed_lines",
]

#: SageMaker's limit on metric definitions per training job, kept for the same reason:
#: every line is searched with every regex
MAX_DEFINITIONS = 40

_EXAMPLE = '[{"Name": "val_loss", "Regex": "val_loss ([0-9.eE+-]+)"}]'


@dataclass(frozen=True)
class MetricDefinition:
    """One metric: a name and a regex whose group 1 is the value."""

    name: str
    regex: re.Pattern

    def value_in(self, line: str) -> float | None:
        """The number the regex captures in ``line``, or None."""
        m = self.regex.search(line)
        if m is None or m.group(1) is None:
            return None
        text = m.group(1).strip()
        try:
            value = float(text)
        except ValueError:
            return None
        return value


def _get(d: dict, key: str) -> Any:
    for k, v in d.items():
        if isinstance(k, str) and k.lower() == key.lower():
            return v
    return None


def load_definitions(spec: Any) -> list[MetricDefinition]:
    """Metric definitions from inline JSON text, a JSON file's path, or Python objects.

    Accepted shapes: a list of ``{"Name": ..., "Regex": ...}``, one such object, or
    ``{"MetricDefinitions": [...]}`` as in a SageMaker estimator's configuration.
    """
    raw = spec
    origin = "metric definitions"
    if isinstance(spec, Path) or isinstance(spec, str):
        text = str(spec).strip()
        if text[:1] in ("[", "{"):
            origin = "inline metric definitions"
        else:
            path = Path(text).expanduser()
            if not path.is_file():
                raise ConfigError(
                    f"metric definitions file {text!r} not found; pass a JSON file or inline JSON like {_EXAMPLE}"
                )
            origin = f"metric definitions file {text}"
            text = path.read_text(encoding="utf-8")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{origin} is not valid JSON ({exc}); write it like {_EXAMPLE}") from exc
    if isinstance(raw, dict):
        inner = _get(raw, "MetricDefinitions")
        raw = inner if inner is not None else [raw]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{origin}: expected a list of {{\"Name\": ..., \"Regex\": ...}} objects, got {raw!r}")
    if len(raw) > MAX_DEFINITIONS:
        raise ConfigError(f"{origin}: {len(raw)} definitions, at most {MAX_DEFINITIONS} are allowed; split them")
    out: list[MetricDefinition] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        name = _get(item, "Name") if isinstance(item, dict) else None
        pattern = _get(item, "Regex") if isinstance(item, dict) else None
        if not isinstance(name, str) or not isinstance(pattern, str) or not name.strip() or not pattern:
            raise ConfigError(f"{origin}: definition {i} is {item!r}; each needs a \"Name\" and a \"Regex\" string, "
                              f"e.g. {_EXAMPLE}")
        if len(name) > 255 or len(pattern) > 500:
            raise ConfigError(f"{origin}: definition {name[:40]!r} is too long (Name at most 255, Regex at most "
                              "500 characters)")
        if name in seen:
            raise ConfigError(f"{origin}: the name {name!r} is defined twice; give each metric one regex")
        seen.add(name)
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{origin}: the regex of {name!r}, {pattern!r}, is invalid: {exc}") from exc
        if regex.groups < 1:
            raise ConfigError(f"{origin}: the regex of {name!r}, {pattern!r}, has no group; put the number in "
                              f"parentheses, e.g. \"{name} ([0-9.eE+-]+)\"")
        out.append(MetricDefinition(name, regex))
    return out


# -- printed output, by epoch --------------------------------------------------------------

@dataclass
class Section:
    """A stretch of an output log between two marks."""

    kind: str  # "start" (before the loop), "epoch", "after", "end" (flor's own report), "unmarked"
    epoch: int | None
    init: bool
    start: int
    stop: int | None
    t_end: float | None


def _marks(log: Path) -> list[dict]:
    path = log.with_name(log.stem + ".marks.jsonl")
    out = []
    try:
        text = read_text(path)  # a regular file of at most MAX_METADATA, no link followed
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        why = exc.strerror if isinstance(exc, StoreFileError) else f"{path}: {exc}"
        warn("FL502", f"skipped the epoch marks {why}")
        text = ""
    if text:
        for line in text.splitlines():
            try:
                mark = json.loads(line)
            except (ValueError, RecursionError):
                continue  # torn by a crash
            if _is_mark(mark):  # the file is untrusted: a mark of another shape is left out
                out.append(mark)
    return out


def _is_mark(mark: Any) -> bool:
    """A mark as flor writes it: ``{"mark": str, "at": byte offset, "t": time, "epoch": int, ...}``."""
    def whole(v: Any) -> bool:
        return type(v) is int and v >= 0

    return (isinstance(mark, dict) and isinstance(mark.get("mark", ""), str) and whole(mark.get("at", 0))
            and (mark.get("epoch") is None or whole(mark["epoch"]))
            and (mark.get("t") is None or type(mark["t"]) in (int, float) and math.isfinite(mark["t"])))


def _sections(log: Path, marks: list[dict]) -> list[Section]:
    if not marks:
        return [Section("unmarked", None, False, 0, None, None)]
    out = []
    if marks[0].get("at", 0) > 0:
        out.append(Section("unmarked", None, False, 0, marks[0]["at"], marks[0].get("t")))
    for i, m in enumerate(marks):
        nxt = marks[i + 1] if i + 1 < len(marks) else None
        out.append(Section(m.get("mark", "unmarked"), m.get("epoch"), bool(m.get("init")), int(m.get("at", 0)),
                           int(nxt["at"]) if nxt else None, nxt.get("t") if nxt else None))
    return out


def printed_lines(log: Path, *, worker: int | None = None) -> Iterator[tuple[str, int | None, str | None, float]]:
    """``(line, epoch, loop, t)`` of every line of an output log that counts (see the module
    docstring). ``loop`` is ``before``/``after`` outside the loop, else None; ``t`` is the
    time at the end of the line's epoch (flor marks epochs, not lines)."""
    marks = _marks(log)
    ngpus = next((m.get("ngpus") for m in marks if m.get("mark") == "end" and "ngpus" in m), None)
    ngpus = ngpus if type(ngpus) is int else None  # untrusted: another type is no count of workers
    try:
        data = read_bytes(log, limit=MAX_OUTPUT)  # a regular file, no link followed: never a FIFO or /dev/zero
        mtime = os.path.getmtime(log)
    except StoreFileError as exc:
        warn("FL502", f"skipped {exc.strerror}")
        return
    except OSError:
        return
    for sec in _sections(log, marks):
        if sec.kind == "end" or sec.init:
            continue  # flor's own report; a replay's initialization epochs
        loop = {"start": "before", "after": "after"}.get(sec.kind)
        if worker is not None and ngpus is not None:
            if loop == "before" and worker != 0 or loop == "after" and worker != ngpus - 1:
                continue
        text = data[sec.start:sec.stop].decode("utf-8", errors="replace")
        t = sec.t_end if sec.t_end is not None else mtime
        for line in re.split(r"[\r\n]", text):
            if line.strip():
                yield line, sec.epoch, loop, t


def output_logs(run_dir: Path) -> list[tuple[str, str | None, int | None, Path]]:
    """``(source, replay, worker, path)`` of a run's output logs: the recording's, then each replay worker's."""
    out: list[tuple[str, str | None, int | None, Path]] = []
    layout = RunLayout(run_dir)
    if layout.stdout.is_file():
        out.append(("record", None, None, layout.stdout))
    out.extend(("replay", replay, worker, path) for replay, worker, path in layout.replay_outputs())
    return out


def _start_time(log: Path, fallback: float) -> float:
    marks = _marks(log)
    return float(marks[0]["t"]) if marks and "t" in marks[0] else fallback


def extract(run_dir: Path, run: str, definitions: list[MetricDefinition], *,
            started: float | None = None) -> list[dict]:
    """Log records of one run's printed output: one per line and definition that match.

    Each record has the fields of ``flor.logs.read_run_logs`` plus ``timestamp`` (seconds
    since the recording or replay worker started, at the end of the line's epoch) and
    ``via: "regex"``.
    """
    out: list[dict] = []
    for source, replay, worker, path in output_logs(run_dir):
        t0 = _start_time(path, started or 0.0)
        for line, epoch, loop, t in printed_lines(path, worker=worker):
            for d in definitions:
                value = d.value_in(line)
                if value is None:
                    continue
                rec = {"name": d.name, "value": value, "epoch": epoch, "step": None, "block": None, "t": t,
                       "run": run, "source": source, "replay": replay, "worker": worker, "via": "regex",
                       "timestamp": round(max(t - t0, 0.0), 3)}
                if loop is not None:
                    rec["loop"] = loop
                out.append(rec)
    return occurrence_keys(out)


def analytics_frame(name: str, definitions: Any, *, run: str | list[str] | None = "all",
                    home: Path | None = None) -> Any:
    """A pandas DataFrame like SageMaker's ``TrainingJobAnalytics(...).dataframe()``, plus
    ``epoch``, ``run``, ``source`` and ``replay``.

    (needs the recorded experiment ``cnn-demo``, so the example is not run as a doctest)

    >>> analytics_frame("cnn-demo", "defs.json")  # doctest: +SKIP
    """
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("analytics_frame needs pandas: pip install pandas"
                          " (or pip install -e '.[pandas]' in flor's checkout)") from exc
    from ..store.experiment import open_experiment

    store = open_experiment(name, home)
    defs = load_definitions(definitions)
    rows: list[dict] = []
    for r in store.select_runs(run):
        rows.extend(extract(store.run_path(r), r, defs))
    columns = ["timestamp", "metric_name", "value", "epoch", "run", "source", "replay"]
    return pd.DataFrame(analytics(rows), columns=columns).astype({"epoch": "Int64"})


def analytics(records: list[dict]) -> list[dict]:
    """The rows of a SageMaker ``TrainingJobAnalytics`` table, plus epoch and where each came from:
    ``timestamp, metric_name, value, epoch, run, source, replay``."""
    rows = [{"timestamp": r.get("timestamp"), "metric_name": r["name"], "value": r["value"],
             "epoch": r.get("epoch"), "run": r["run"], "source": r["source"], "replay": r.get("replay")}
            for r in records]
    rows.sort(key=lambda r: (r["run"], r["source"] != "record", r["replay"] or "", r["timestamp"] or 0.0))
    return rows
