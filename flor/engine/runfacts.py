"""What a recording notes of its run besides its epochs (``RunFacts``, a part
``flor.engine.record.RecordSession`` owns): the script's copy and its signature, git's view of the
script's tree and the GPUs (both found on the writer thread, off training's), and the
hyperparameters argparse or ``flor.arg`` give after the run started, with the argv secrets they
reveal. Each goes into run.json through the session's own write, which adds its figures."""

from __future__ import annotations

import sys
from typing import Any, Callable

from .. import hparams
from ..redact import redact_argv
from ..runinfo import git_info, gpus
from ..settings import Settings
from ..store.layout import RunLayout
from ..store.trust import sign_run
from .runrecord import RunRecord
from .session import copy_source, source_sha

__all__ = ["RunFacts"]


class RunFacts:
    """The script's copy, signature, git state, GPUs and late hyperparameters of one recording.
    ``write`` writes run.json (the session's ``write_meta``); ``closed`` says whether the session
    closed, after which only its own final write does; ``write_failed`` counts a failed write."""

    def __init__(self, settings: Settings, record: RunRecord, layout: RunLayout, script: str, *,
                 write: Callable[[], Any], closed: Callable[[], bool],
                 write_failed: Callable[[str, BaseException], None]) -> None:
        self.settings, self.record, self.meta, self.layout, self.script = settings, record, record.meta, layout, script
        self._write, self._closed, self._write_failed = write, closed, write_failed
        self.argv, self.source_sha = list(sys.argv), None  # kept to hide later-known secret flags (argparse)
        hparams.subscribe(self.hyperparameters)
        try:
            copy_source(script, layout.source)
            self.source_sha = source_sha(layout.source, script)
            self.meta.signature = sign_run(settings.config_dir, self.meta.argv, self.source_sha)
        except OSError as exc:
            write_failed("source", exc)

    def _written(self) -> None:
        if not self._closed():
            self._write()

    def git(self) -> None:
        """The script's git commit, branch and dirtiness into run.json, and its diff beside it, on
        the writer (``flor.runinfo.git_info``)."""
        git, diff = git_info(self.script, exclude=[self.settings.home])
        if diff:
            try:
                self.layout.diff_patch.write_text(diff)
            except OSError as exc:
                self._write_failed("source", exc)
        if git is not None:
            with self.record.lock:
                self.meta.git = git
            self._written()

    def gpus(self) -> None:
        """The GPUs into run.json's versions, on the writer (``flor.runinfo.gpus``)."""
        found = gpus()
        if found:
            with self.record.lock:
                self.meta.versions = {**self.meta.versions, **found}
            self._written()

    def hyperparameters(self, values: dict[str, Any]) -> None:
        """argparse or flor.arg gave more hyperparameters after the run started; options whose dest is
        secret-like hide their values in argv too (then signed again)."""
        self.meta.hyperparameters = values
        argv = redact_argv(self.argv, hparams.secret_flags())
        if argv != self.meta.argv:
            self.meta.argv = argv
            self.meta.signature = sign_run(self.settings.config_dir, argv, self.source_sha)
        self._written()
