"""Reading a run's replay summaries (``logs/replay-<id>-<w>.summary.json``) and ``flor replay``'s
launch records (``logs/launch-<id>.json``): untrusted input, checked once here.

A store may be shared, so these files may be damaged or planted. A file whose fields have
other types or shapes than flor writes (``"started": [1]``, ``"ngpus": "two"``, a block event
with unknown keys) is skipped with one warning naming it, the field and what to do; the
callers then treat it as absent (a worker without a summary, a launch without a record),
never as a traceback.

>>> summary_problem({"ngpus": "two"})
"ngpus is str 'two', expected int"
>>> summary_problem({"segment": [0, 3], "blocks": [{"epoch": 0, "block": "b", "occurrence": 0, "action": "restored"}]})
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from .._files import StoreFileError, read_text
from ..errors import warn
from ..verify import BlockEvent

__all__ = ["launch_problem", "read_launch_record", "read_summary", "summary_problem"]

_BLOCK_FIELDS = {f.name for f in dataclasses.fields(BlockEvent)}
_BLOCK_REQUIRED = {f.name for f in dataclasses.fields(BlockEvent)
                   if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def _kind(value: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _field(obj: dict, name: str, *kinds: type) -> str | None:
    value = obj.get(name)
    if value is None or _kind(value, kinds):
        return None
    return f"{name} is {type(value).__name__} {value!r:.40}, expected {' or '.join(k.__name__ for k in kinds)}"


def _span(obj: dict, name: str) -> str | None:
    value = obj.get(name)
    if value is None or (isinstance(value, list) and len(value) == 2 and all(_kind(v, (int,)) for v in value)):
        return None
    return f"{name} is {value!r:.40}, expected [start, stop]"


def _strings(obj: dict, name: str) -> str | None:
    value = obj.get(name)
    if value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return None
    return f"{name} is {value!r:.40}, expected a list of strings"


def summary_problem(s: Any) -> str | None:
    """What is wrong with a parsed replay summary, or None when it has flor's shape."""
    if not isinstance(s, dict):
        return f"it is a JSON {type(s).__name__}, expected an object"
    for problem in (_field(s, "ngpus", int), _field(s, "shared_logs", int), _field(s, "exit", str),
                    _field(s, "verdict", str), _field(s, "counts", dict), _field(s, "script_sha256", str),
                    _field(s, "log_mismatches", list), _field(s, "loop", list), _span(s, "segment"),
                    _span(s, "init"), _strings(s, "hindsight"), _strings(s, "notes"), _strings(s, "ran_new"),
                    _field(s, "new_logs", list)):
        if problem is not None:
            return problem
    if any(not (isinstance(x, list) and len(x) == 2 and all(isinstance(v, str) for v in x))
           for x in s.get("new_logs") or []):
        return "new_logs holds an item that is not a [name, where] pair of strings"
    if any(not _kind(v, (int,)) for v in (s.get("counts") or {}).values()):
        return "counts holds a value that is not a whole number"
    blocks = s.get("blocks")
    if blocks is not None and not isinstance(blocks, list):
        return f"blocks is {type(blocks).__name__}, expected a list"
    for b in blocks or []:
        if not isinstance(b, dict) or not _BLOCK_REQUIRED <= b.keys() <= _BLOCK_FIELDS:
            return f"blocks holds {b!r:.60}, not a block event"
    return None


def launch_problem(rec: Any) -> str | None:
    """What is wrong with a parsed launch record, or None when it has flor's shape."""
    if not isinstance(rec, dict):
        return f"it is a JSON {type(rec).__name__}, expected an object"
    for problem in (_field(rec, "replay", str), _field(rec, "status", str), _field(rec, "host", str),
                    _field(rec, "started", int, float), _field(rec, "slowdown", int, float),
                    _field(rec, "startup_slowdown", int, float), _field(rec, "replay_extra_s", int, float),
                    _field(rec, "pid", int), _field(rec, "workers", int), _field(rec, "segments", list)):
        if problem is not None:
            return problem
    for seg in rec.get("segments") or []:
        if not isinstance(seg, dict) or not (seg.get("startup_s") is None or _kind(seg["startup_s"], (int, float))):
            return f"segments holds {seg!r:.60}, not a worker's segment"
    return None


_WARNED: set[Path] = set()


def _read(path: Path, problem: Any, what: str) -> dict | None:
    try:
        obj = json.loads(read_text(path))  # a regular file, capped, no link followed
    except StoreFileError as exc:
        warn("FL502", f"skipped {exc.strerror}")
        return None
    except (OSError, ValueError, RecursionError):
        return None  # missing, or torn by a crash while it was written: as if absent
    why = problem(obj)
    if why is not None:
        if path in _WARNED:  # read again (the estimate, then the launch): said once
            return None
        _WARNED.add(path)
        warn("FL502", f"skipped {what} {path}: {why}; the file is damaged or planted, "
                      "move it out of the run's logs/ folder")
        return None
    return obj


def read_summary(path: Path) -> dict | None:
    """A replay worker's summary, or None (with one warning when it has another shape)."""
    return _read(path, summary_problem, "the replay summary")


def read_launch_record(path: Path) -> dict | None:
    """A ``flor replay`` launch record, or None (with one warning when it has another shape)."""
    return _read(path, launch_problem, "the launch record")
