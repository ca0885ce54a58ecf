"""flor: hindsight logging for PyTorch training.

Record a run with ``python train.py --flor NAME``; later add ``flor.log`` statements and
replay with ``--replay_flor`` to get the values a full retraining would give.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    CheckpointError, ConfigError, CorruptBlobError, FlorError, ReplayError, StateError, StorageError,
)
from .hparams import arg
from .hparams import install_argparse_capture as _install_argparse_capture
from .loop import it
from .session import current as _current
from .session import ensure_replayable as _ensure_replayable
from .settings import SETTINGS as _SETTINGS
from .skipblock import SkipBlock

__version__ = "0.1.0"

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
    "dataframe",
    "it",
    "log",
]


def log(name: str, value: Any, step: Any = None) -> Any:
    """Record a scalar under ``name`` for the current epoch (and ``step``); return ``value``.

    >>> log("loss", 0.5)
    0.5
    """
    session = _current()
    if session is not None:
        session.log(name, value, step)
    return value


def dataframe(*names: str, name: str | None = None, run: str | None = "all", hparams: bool = False,
              definitions: Any = None) -> Any:
    """The logged values of ``names`` as a pandas DataFrame, one row per run, epoch and step.

    ``hparams=True`` adds a column per hyperparameter; ``definitions`` adds regex metrics
    from the printed output. Needs pandas (``pip install 'flor[pandas]'``). See
    ``flor.analysis.dataframe``.
    """
    from .analysis import dataframe as _dataframe

    return _dataframe(*names, name=name, run=run, hparams=hparams, definitions=definitions)


_ensure_replayable(_SETTINGS)
if _SETTINGS.mode != "inert":
    _install_argparse_capture()  # the script's argparse namespace becomes the run's hyperparameters
