"""Syncing an experiment with its spool, ``s3://bucket/prefix``: push (upload) and pull (download).

The remote layout mirrors ``FLOR_HOME``: ``PREFIX/NAME/objects/...`` and ``PREFIX/NAME/runs/<run>/...``,
so one prefix holds many experiments and a spooled run replays on any machine.

- ``push``: ``Spooler`` (upload runs, evict, budget), ``BackgroundSpool`` (during a recording),
  ``spool_files``;
- ``pull``: ``pull_run``, ``RemoteBlobs`` (fetch and prefetch, the remote of a ``BlobStore``),
  ``LazyRemote``, ``attach_spool``, ``find_spooled_run``.

Runs are chosen by ``flor.store.experiment.pick_run``, the same rule as for local runs. Nothing
here prints: progress goes to a ``progress`` factory (``flor._fmt.progress``) and messages to a
``say`` callback, both handed in by the caller; problems are ``flor.errors.warn``.

(needs an S3 bucket, so the example is not run as a doctest)

>>> from flor.store.sync import Spooler, pull_run          # doctest: +SKIP
>>> Spooler(ExperimentStore(home, "demo"), "s3://bucket/flor").spool()   # doctest: +SKIP
"""

from .pull import (LazyRemote, RemoteBlobs, attach_spool, find_spooled_run, open_spool, prefetch_plan, pull_run,
                   spooled_runs)
from .push import BackgroundSpool, Spooler, parallel, spool_files

__all__ = [
    "BackgroundSpool", "LazyRemote", "RemoteBlobs", "Spooler", "attach_spool", "find_spooled_run", "open_spool",
    "parallel", "prefetch_plan", "pull_run", "spool_files", "spooled_runs",
]
