"""flor: hindsight logging for PyTorch training.

Record a run with ``python train.py --flor NAME``; later add ``flor.log`` statements and
replay with ``--replay_flor`` to get the values a full retraining would give.
"""

from __future__ import annotations

from ._version import __version__
from .api import SkipBlock, arg, checkpoints, dataframe, it, load, log, recording, replaying
from .errors import (
    CheckpointError, ConfigError, CorruptBlobError, FlorError, ReplayError, StateError, StorageError,
)
from .hparams import install_argparse_capture as _install_argparse_capture
from .runtime import ensure_replayable as _ensure_replayable
from .runtime import quiet_trackers as _quiet_trackers
from .settings import SETTINGS as _SETTINGS

__all__ = [
    "CheckpointError",
    "ConfigError",
    "CorruptBlobError",
    "FlorError",
    "ReplayError",
    "SkipBlock",
    "StateError",
    "StorageError",
    "__version__",
    "arg",
    "checkpoints",
    "dataframe",
    "it",
    "load",
    "log",
    "recording",
    "replaying",
]

_ensure_replayable(_SETTINGS)
_quiet_trackers(_SETTINGS)  # a replay: the script's own tracker calls write nowhere (flor.engine.trackers)
if _SETTINGS.mode != "inert":
    _install_argparse_capture()  # the script's argparse namespace becomes the run's hyperparameters
if _SETTINGS.mode == "record":  # the code of a sys.exit(main()): its sys.exit is looked up before main() records
    import sys as _sys

    from .engine.exits import watch_exits as _watch_exits

    _watch_exits(_sys._getframe())
