"""The process's session: started at the first flor call of a run with ``--flor NAME``
(never at import), None when flor is inert.

The engine's sessions know nothing of this module; the API calls ``current()``.
"""

from __future__ import annotations

import sys
import threading

from .engine.session import Session
from .errors import FlorError, ReplayError
from .settings import SETTINGS, Settings
from .store import ExperimentStore

__all__ = ["current", "ensure_replayable", "start"]

_SESSION: Session | None = None
_LOCK = threading.Lock()


def current() -> "Session | None":
    """The session of this process, started on first use; None when flor is inert."""
    global _SESSION
    if _SESSION is not None or SETTINGS.mode == "inert":
        return _SESSION
    with _LOCK:
        if _SESSION is None:
            _SESSION = start(SETTINGS)
    return _SESSION


def start(settings: Settings) -> "Session":
    if settings.mode == "record":
        from .engine.ddp import RankSession
        from .placement import record_rank

        rank, world = record_rank()
        if rank > 0:  # DDP: rank 0 records the run, the other ranks only their logs (see flor.ddp)
            return RankSession(settings, rank, world)
        from .engine.record import RecordSession

        return RecordSession(settings)
    from .engine.replay import ReplaySession

    return ReplaySession(settings)


def ensure_replayable(settings: Settings) -> None:
    """Fail early, at import, when a replay names an experiment with nothing recorded."""
    if settings.mode != "replay":
        return
    store = ExperimentStore(settings.home, settings.name or "")
    try:
        try:
            store.resolve_run(settings.run)
        except ReplayError:
            if not settings.spool:
                raise
            from .store.sync import find_spooled_run  # not local: is it in the S3 spool?

            find_spooled_run(store, settings.spool, settings.run)
    except FlorError as exc:
        print(f"flor: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
