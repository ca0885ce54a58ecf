"""The functions a training script calls: ``it``, ``SkipBlock``, ``log``, ``arg``,
``replaying``/``recording``; and for a notebook ``dataframe``, ``load`` and ``checkpoints``. Each
of the script's is a thin call into the process's session (``runtime.current()``), and each is
inert (passes values through) without ``--flor``.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator, Sequence, TypeVar

from . import hparams, runtime
from .source.blocks import loop_wrapper
from .engine.session import Session, as_result
from .errors import ConfigError
from .runtime import current, install_error_hook
from .settings import SETTINGS

__all__ = ["SkipBlock", "arg", "checkpoints", "dataframe", "it", "load", "log", "recording", "replaying"]

T = TypeVar("T")


def it(iterable: Iterable[T]) -> Iterable[T]:
    """Wrap the outer (epoch) loop.

    Inert, it returns ``iterable`` itself. Recording, it numbers the epochs. Replaying, it
    skips to the epochs this worker initializes from and stops after its segment. Its
    ``len()`` is the number of epochs the loop will run here, so ``tqdm(flor.it(range(n)))``
    has a total.

    >>> for epoch in it(range(3)):
    ...     pass
    >>> epoch
    2
    """
    session = current()
    if session is None:
        return iterable
    session.loop_frame = sys._getframe(1)  # the loop's own variables: outer-loop state (flor.watch.loop)
    session.loop_wrapper = loop_wrapper(session.loop_frame)  # enumerate(flor.it(...)): replay workers differ
    return _Epochs(session, iterable)


class _Epochs(Iterator[T]):
    """``flor.it`` of a run: the session's loop over ``iterable``, with a ``len()``.

    An iterator, like the generator it wraps (``next()`` works); the loop starts at the first
    item, not at ``flor.it(...)``."""

    def __init__(self, session: Session, iterable: Iterable[T]) -> None:
        self._session, self._iterable = session, iterable
        self._loop: Iterator[T] | None = None

    def __len__(self) -> int:
        return self._session.loop_length(self._iterable)  # TypeError when unknown, as len() says

    def __iter__(self) -> Iterator[T]:
        """The session's loop itself: a ``for`` loop's ``next()`` goes straight to it (one frame
        less an epoch, a block per iteration's every run), and ``next()`` on this object to the same."""
        if self._loop is None:
            self._loop = iter(self._session.iterate(self._iterable))
        return self._loop

    def __next__(self) -> T:
        return next(self._loop if self._loop is not None else self.__iter__())

    def close(self) -> None:
        """End the loop early, as a generator's ``close()`` does (its ``finally`` runs now)."""
        if self._loop is not None and hasattr(self._loop, "close"):
            self._loop.close()


class SkipBlock:
    """A block of code whose effects on the objects given to ``end`` are checkpointed.

    >>> x = [0]
    >>> if SkipBlock.step_into("work"):
    ...     x[0] += 1
    >>> SkipBlock.end(x)
    [1]

    It has no instances: ``with flor.SkipBlock("train") as b:`` (the original FLOR's form) cannot
    skip its body, since a ``with`` statement always runs it, so it fails with the form to write:

    >>> SkipBlock("train")
    Traceback (most recent call last):
    ...
    TypeError: flor.SkipBlock("train") is not a context manager (a `with` body cannot be skipped); write ...
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> SkipBlock:
        name = args[0] if args and isinstance(args[0], str) else kwargs.get("name", "train")
        raise TypeError(f"flor.SkipBlock({name!r}) is not a context manager (a `with` body cannot be skipped); "
                        f"write `if flor.SkipBlock.step_into({name!r}): ...` and after the block "
                        "`net, opt = flor.SkipBlock.end(net, opt)`".replace("'", '"'))

    @staticmethod
    def step_into(name: str, probed: bool = False) -> bool:
        """Whether to run the block body: always while recording; on replay only when the
        block is ``probed`` (logging was added inside it) or has no checkpoint."""
        session = runtime._SESSION or current()  # (the session once started: no call, a block per iteration)
        if session is None:
            return True
        return session.step_into(name, probed)

    @staticmethod
    def end(*objs: Any) -> Any:
        """Capture (record) or restore (replay) the state of ``objs``; return them.

        Returns the single object for one argument, else a tuple in the same order, so
        immutable values (step counters) can be rebound: ``net, step = SkipBlock.end(net, step)``.
        """
        session = runtime._SESSION or current()
        if session is None:
            return as_result(objs)
        return session.end(objs)


def log(name: str, value: Any, step: Any = None) -> Any:
    """Record a scalar under ``name`` for the current epoch (and ``step``); return ``value``.

    >>> log("loss", 0.5)
    0.5
    """
    session = current()
    if session is not None:
        session.log(name, value, step)
    return value


def arg(name: str, default: T) -> T:
    """Declare a hyperparameter: ``--NAME VALUE`` from the command line (typed like
    ``default``) or ``default``, recorded with the run; a replay gets the recorded value.

    >>> arg("lr", 0.01)
    0.01
    """
    try:
        hparams.parse(name, default)  # a bad value fails before a recording starts, plain runs too
    except ConfigError:
        install_error_hook(SETTINGS)  # one line and exit 2, as argparse does
        raise
    # a recording does not start for flor.arg: a bad value in a later flor.arg then ends the
    # script before any run directory exists (no empty crashed run for a replay to pick)
    session = current() if SETTINGS.mode == "replay" else None
    return hparams.arg(name, default, session, recording=SETTINGS.mode == "record")


def replaying() -> bool:
    """True in a ``--replay_flor`` run: guard side effects that must not happen twice
    (``if not flor.replaying(): torch.save(...)``).

    >>> replaying()
    False
    """
    session = current()
    return session is not None and session.mode == "replay"


def recording() -> bool:
    """True in a ``--flor NAME`` recording (False when inert or replaying).

    >>> recording()
    False
    """
    session = current()
    return session is not None and session.mode == "record"


def dataframe(*names: str, name: str | None = None, run: str | None = "all", hparams: bool = False,
              definitions: Any = None) -> Any:
    """The logged values of ``names`` as a pandas DataFrame, one row per run, epoch and step.

    ``hparams=True`` adds a column per hyperparameter; ``definitions`` adds regex metrics
    from the printed output. Needs pandas (``pip install -e '.[pandas]'``). See
    ``flor.analysis.dataframe``.
    """
    from .analysis import dataframe as _dataframe
    from .settings import SETTINGS

    # the readers take no defaults from the process: this run's experiment and home are given here
    return _dataframe(*names, name=name or SETTINGS.name, run=run, home=SETTINGS.home, hparams=hparams,
                      definitions=definitions)


def load(name: str | None, epoch: int | None, *, into: Sequence[Any], block: str | None = None,
         run: str | None = None, occurrence: int = 0, rng: bool = False, trust_pickles: bool = False) -> Any:
    """Restore the state ``end()`` was given at ``epoch`` into live objects, without a replay.

    ``into`` holds the objects in the order ``end()`` got them (None leaves one out); they come
    back as ``end()`` returns them. Checked like a replay's restore (digests, hashes, and pickled
    leaves only from a manifest signed with your key). ``flor.checkpoints(NAME)`` lists what exists::

        net, opt = make_model()
        net, opt = flor.load("cnn-demo", 37, into=(net, opt), block="train")
        evaluate(net)
    """
    from .engine.loader import load as _load
    from .settings import SETTINGS

    return _load(name or SETTINGS.name, epoch, into=into, block=block, run=run, occurrence=occurrence, rng=rng,
                 trust_pickles=trust_pickles, home=SETTINGS.home)


def checkpoints(name: str | None = None, *, run: str | Sequence[str] | None = None) -> list:
    """The checkpoints ``flor.load`` can restore: ``Checkpoint(run, block, epoch, occurrence)`` of the
    latest run (``run="all"``: of every run), in epoch order."""
    from .engine.loader import checkpoints as _checkpoints
    from .settings import SETTINGS

    return _checkpoints(name or SETTINGS.name, run=run, home=SETTINGS.home)
