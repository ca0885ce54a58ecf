"""The process's session: started at the first flor call of a run with ``--flor NAME``
(never at import), None when flor is inert.

The engine's sessions know nothing of this module; the API calls ``current()``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

from .engine.session import Session
from .errors import ConfigError, FlorError, ReplayError, StorageError, warn
from .settings import SETTINGS, Settings
from .store import ExperimentStore

__all__ = ["current", "ensure_replayable", "install_error_hook", "quiet_trackers", "start"]

_SESSION: Session | None = None
_INERT = False  # a recording that could not start (unwritable store): the script runs without flor
_LOCK = threading.Lock()
_HOOKED = False


def current() -> Session | None:
    """The session of this process, started on first use; None when flor is inert."""
    global _SESSION, _INERT
    if _SESSION is not None or _INERT or SETTINGS.mode == "inert":
        return _SESSION
    with _LOCK:
        if _SESSION is None and not _INERT:
            install_error_hook(SETTINGS)
            try:
                _SESSION = start(SETTINGS)
            except (StorageError, OSError) as exc:
                if SETTINGS.mode != "record":
                    raise
                _check_home(SETTINGS)  # FLOR_HOME itself is wrong: a setting to fix, not a full disk
                _INERT = True  # training never stops because flor cannot write its store
                warn("FL001", f"cannot record into {SETTINGS.home / (SETTINGS.name or '')} ({exc}); training goes on "
                     "without recording")
    return _SESSION


def _check_home(settings: Settings) -> None:
    """A ConfigError when FLOR_HOME (or a folder above it) is a file, not a folder."""
    path = settings.home
    while not path.exists() and path.parent != path:
        path = path.parent
    if not path.is_dir():
        raise ConfigError(f"FLOR_HOME={settings.home} cannot hold experiments: {path} is a file, not a folder; "
                          "set FLOR_HOME to a folder (default ~/.flor)")


def install_error_hook(settings: Settings) -> None:
    """End the script with one line ``flor: error: ...`` and exit status 2 when a FlorError
    (something the user must act on: mismatched epochs, arguments of ``end()``, settings)
    reaches the top; its traceback only with ``FLOR_DEBUG=1``. Other exceptions keep Python's
    traceback and exit status. The session's exit work (atexit) still runs first."""
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    previous = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if not issubclass(exc_type, FlorError):
            previous(exc_type, exc, tb)
            return
        if settings.debug:
            previous(exc_type, exc, tb)
        message = " ".join(str(exc).split()) or exc_type.__name__
        print(f"flor: error: {message}", file=sys.stderr)
        try:
            atexit._run_exitfuncs()  # the session's close: final status, replay summary
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - exiting anyway
                    pass
            os._exit(2)  # excepthook cannot set the status any other way (Python exits 1 after it)

    sys.excepthook = hook


def start(settings: Settings) -> Session:
    from .malloc import raise_thresholds

    raise_thresholds(settings.malloc)  # a CPU training step no longer gives its heap back at every step (flor.malloc)
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


def quiet_trackers(settings: Settings) -> None:
    """In a replay, from ``import flor`` on: the script's own MLflow, W&B and SummaryWriter calls write
    nowhere a team looks (flor.engine.trackers); the session starts when a writer needs its folder."""
    if settings.mode != "replay":
        return
    from .engine.trackers import quiet_trackers as install

    def session() -> Any:
        return current()

    install(lambda: session().script_tb, lambda: session().recorded_mlflow_run())


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
