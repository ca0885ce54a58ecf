"""The hook-driven session API: ``flor.it`` and ``SkipBlock`` for a framework that owns the loop.

A trainer (Lightning, Hugging Face) calls hooks where a script would write the loop, so an
integration drives the same session by epoch number: record, replay, verification, the budget,
the store and the parallel plans are the engine's, and the flags (``--flor NAME``,
``--replay_flor [PID/N]``, ``flor replay NAME --workers N``) and ``FLOR_*`` variables are too.

    epochs = flor.hooks.Epochs()
    for epoch in range(epochs.first(), max_epochs):     # where the trainer starts its loop
        if not epochs.begin(epoch):                     # not this process's epoch: stop
            break
        if epochs.train():                              # False: replay restores this epoch
            ...                                         # the epoch's training steps
        model, optimizer = epochs.checkpoint(model, optimizer)
        ...                                             # validation, epoch-end hooks, flor.log
    epochs.finish()

Without ``--flor`` every method passes through (``train()`` is True, ``checkpoint`` returns its
arguments), so a callback built on it does nothing at all.
"""

from __future__ import annotations

from typing import Any, Iterator

from .engine.session import Session, as_result
from .runtime import current
from .source.hindsight import FRAMEWORK_BLOCK
from .store.runlogs import read_run_logs

__all__ = ["Epochs"]


class Epochs:
    """One framework loop over epochs, as ``flor.it`` around it and one ``SkipBlock`` in it.

    >>> epochs = Epochs()
    >>> epochs.first(), epochs.begin(0), epochs.train(), epochs.checkpoint([1])
    (0, True, True, [1])
    """

    def __init__(self, block: str = FRAMEWORK_BLOCK) -> None:
        # the SkipBlock's name: one per epoch, around the epoch's training steps. A hindsight flor.log
        # in the script's training hooks makes a replay re-execute it (flor.source.hindsight)
        self.block = block
        self.session: Session | None = current()
        self.epoch: int | None = None  # the epoch begun last
        self.open = False  # train() was called and checkpoint() not yet
        self._more = True
        self._loop: Iterator[int] | None = None
        self._next: int | None = None  # the epoch the session's loop gave and the trainer has not reached
        self._done = False
        self._recorded: set[str] | None = None
        watch = getattr(self.session, "watch", None)
        if watch is not None:
            # no script frame holds the loop: the framework's objects are all given to checkpoint(),
            # and the variables of the framework's own frames are not the script's state
            watch.probes = []

    @property
    def mode(self) -> str:
        """``inert``, ``record`` or ``replay``."""
        return "inert" if self.session is None else self.session.mode

    def _numbers(self) -> Iterator[int]:
        epoch = 0
        while self._more:
            yield epoch
            epoch += 1

    def _advance(self) -> int | None:
        assert self.session is not None
        if self._loop is None:
            self._loop = iter(self.session.iterate(self._numbers()))
        try:
            return next(self._loop)
        except StopIteration:
            self._done = True
            return None

    def first(self) -> int:
        """The first epoch this process runs: 0, or where a replay worker starts (the newest
        checkpoint before its segment). The trainer starts its loop there."""
        if self.session is None or self.session.mode != "replay" or self._done:
            return 0
        if self._next is None:
            self._next = self._advance()
        return self._next if self._next is not None else 0

    def begin(self, epoch: int) -> bool:
        """The trainer starts ``epoch``: True if this process runs it, False past the epochs it
        replays (the trainer stops). Ends the epoch begun before."""
        if self.session is None:
            self.epoch = epoch
            return True
        if self._done:
            return False
        if self.open:
            self.abandon()
        while True:
            got = self._next if self._next is not None else self._advance()
            self._next = None
            if got is None:
                return False
            if got >= epoch:
                break
        if got > epoch:  # the trainer is behind this worker's plan: it runs this epoch only later
            self._next = got
            return False
        self.epoch = epoch
        return True

    def train(self, probed: bool = False) -> bool:
        """``SkipBlock.step_into``: whether to run this epoch's training steps (always while
        recording; replaying, only where no checkpoint is kept, or ``probed``)."""
        if self.session is None:
            return True
        self.open = True
        return self.session.step_into(self.block, probed)

    def checkpoint(self, *objs: Any) -> Any:
        """``SkipBlock.end``: capture (record) or restore (replay) ``objs`` and the random
        generators, once the epoch's training steps are done; returns them like ``end``."""
        if self.session is None or not self.open:
            return as_result(objs)
        self.open = False
        return self.session.end(objs)

    def abandon(self) -> None:
        """The epoch's training ended without ``checkpoint()`` (the trainer stopped in it): the
        block closes without a checkpoint, and a replay re-executes it."""
        if self.session is not None and self.open:
            self.open = False
            self.session.close_left_open("when the trainer left the epoch")

    def recorded_names(self) -> set[str] | None:
        """The names the recording logged, when replaying (None otherwise): a value added in
        hindsight is no state of the recording's, so a state check of an executed epoch leaves it out."""
        session: Any = self.session
        if session is None or session.mode != "replay":
            return None
        if self._recorded is None:
            self._recorded = {r["name"] for r in read_run_logs(session.run_dir, session.run) if r["source"] == "record"}
        return self._recorded

    def log(self, name: str, value: Any, step: Any = None) -> None:
        """``flor.log`` in the current epoch."""
        if self.session is not None:
            self.session.log(name, value, step)

    def finish(self) -> None:
        """The trainer's loop ended (every epoch, or early stopping): the last epoch ends."""
        if self.session is None or self._done:
            return
        if self.open:
            self.abandon()
        self._more = False
        if self._loop is not None:
            while self._advance() is not None:
                pass
        self._done = True
