"""Record and replay sessions driven in the test's own process, as ``flor.it`` and ``SkipBlock`` drive them.

A session installs process hooks (``sys.excepthook``, SIGTERM/SIGHUP handlers, an atexit
close, a tee of stdout and stderr into the run); ``isolated`` undoes them after the test, so
the sessions' own code runs unchanged, on a real frame (the test function's) and a real store.
"""

from __future__ import annotations

import atexit
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from flor.engine.record import RecordSession
from flor.engine.replay import ReplaySession
from flor.engine.session import Session
from flor.settings import Settings


@contextmanager
def isolated(argv0: str) -> Iterator[list[Session]]:
    """Sessions made inside run with ``sys.argv == [argv0]`` and leave no hook behind: append
    each to the list yielded."""
    saved = (sys.argv, sys.excepthook, sys.stdout, sys.stderr,
             {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)})
    sessions: list[Session] = []
    sys.argv = [argv0]
    try:
        yield sessions
    finally:
        for s in sessions:
            atexit.unregister(s._close_at_exit)
        sys.argv, sys.excepthook, sys.stdout, sys.stderr = saved[:4]
        for sig, handler in saved[4].items():
            signal.signal(sig, handler)


def settings(home: Path, mode: str, **kw: object) -> Settings:
    return Settings(mode=mode, name="unit", home=home, config_dir=home / "config", **kw)  # type: ignore[arg-type]


def train(session: Session, epochs: int = 4, seed: int = 0) -> list[float]:
    """A tiny regression trained ``epochs`` epochs under ``session``: one block an epoch that
    ``end()`` gives the model and optimizer; returns the loss ``flor.log`` records each epoch."""
    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(32, 4), torch.randn(32, 1)
    session.loop_frame = sys._getframe()
    session.loop_wrapper = None
    losses = []
    for epoch in session.iterate(range(epochs)):
        if session.step_into("train", False):
            for _ in range(3):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(net(x), y)
                loss.backward()
                opt.step()
        session.end((net, opt))
        with torch.no_grad():
            value = torch.nn.functional.mse_loss(net(x), y).item()
        session.log("loss", value, None)
        losses.append(value)
    return losses


def script_copy(home: Path, argv0: str) -> str:
    """``argv0`` copied outside any git work tree (a recording runs `git` for a script inside one)."""
    dest = home / "script" / Path(argv0).name
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(Path(argv0).read_text())
    return str(dest)


def record(home: Path, argv0: str, **kw: object) -> RecordSession:
    with isolated(script_copy(home, argv0)) as made:
        session = RecordSession(settings(home, "record", every=1, **kw))
        made.append(session)
        train(session)
        session.close()
    return session


def replay(home: Path, argv0: str, **kw: object) -> tuple[ReplaySession, list[float]]:
    with isolated(script_copy(home, argv0)) as made:
        session = ReplaySession(settings(home, "replay", **kw))
        made.append(session)
        losses = train(session)
        session.close()
    return session, losses
