"""flor.hooks.Epochs: a framework's epoch hooks drive a session's loop as ``flor.it`` would.

The sessions here are stand-ins with the engine's loop protocol (``iterate`` a generator over
the epochs this process runs, ``step_into``, ``end``, ``close_left_open``), so the test is of the
driver: which epochs a trainer runs, where a replay worker starts, how the loop ends. The real
sessions under real trainers are tests/e2e/test_frameworks.py's."""

from __future__ import annotations

import pytest

from flor import hooks
from flor.hooks import Epochs


class Watch:
    probes = ["a probe of the script's frame"]


class Loop:
    """The engine's loop for a worker that runs epochs ``first`` to ``stop - 1`` (a recording: 0 on)."""

    def __init__(self, mode: str, first: int = 0, stop: int | None = None) -> None:
        self.mode, self.first, self.stop = mode, first, stop
        self.watch = Watch()
        self.calls: list[tuple] = []
        self.ended = None  # how the loop ended: "completed", "stopped"

    def iterate(self, items):
        for epoch, item in enumerate(items):
            if epoch < self.first:
                continue
            if self.stop is not None and epoch >= self.stop:
                self.ended = "stopped"
                return
            self.calls.append(("epoch", item))
            yield item
        self.ended = "completed"

    def step_into(self, name, probed):
        self.calls.append(("step_into", name, probed))
        return self.mode == "record" or probed

    def end(self, objs):
        self.calls.append(("end", objs))
        return objs[0] if len(objs) == 1 else objs

    def close_left_open(self, when):
        self.calls.append(("left open", when))

    def log(self, name, value, step):
        self.calls.append(("log", name, value, step))


@pytest.fixture
def driven(monkeypatch):
    def make(loop: Loop) -> Epochs:
        monkeypatch.setattr(hooks, "current", lambda: loop)
        return Epochs()
    return make


def test_inert_passes_everything_through() -> None:
    epochs = Epochs()
    assert epochs.mode == "inert" and epochs.first() == 0
    assert [epochs.begin(e) for e in range(3)] == [True] * 3
    assert epochs.train() is True and epochs.checkpoint(1, 2) == (1, 2)
    epochs.finish()


def test_recording_numbers_each_epoch_and_completes(driven) -> None:
    loop = Loop("record")
    epochs = driven(loop)
    assert loop.watch.probes == []  # no script frame holds a trainer's loop
    for e in range(3):
        assert epochs.begin(e) and epochs.train()
        assert epochs.checkpoint("net") == "net"
        epochs.log("val", e)
    epochs.finish()
    assert loop.ended == "completed"
    assert [c for c in loop.calls if c[0] == "epoch"] == [("epoch", 0), ("epoch", 1), ("epoch", 2)]
    assert ("log", "val", 2, None) in loop.calls


def test_an_epoch_the_trainer_left_is_closed_without_a_checkpoint(driven) -> None:
    loop = Loop("record")
    epochs = driven(loop)
    epochs.begin(0)
    epochs.train()
    epochs.finish()  # early stopping inside the epoch's training
    assert loop.calls[-1][0] == "left open" and ("end", ()) not in loop.calls


def test_a_replay_worker_starts_at_its_first_epoch_and_stops_after_its_segment(driven) -> None:
    loop = Loop("replay", first=2, stop=4)
    epochs = driven(loop)
    assert epochs.first() == 2  # the trainer starts its loop there
    assert epochs.begin(0) is False and epochs.begin(1) is False  # before the worker's epochs: not run
    assert epochs.begin(2) and epochs.train() is False  # restored: no training steps
    epochs.checkpoint("net")
    assert epochs.begin(3) and epochs.train(probed=True) is True  # probed: executed
    epochs.checkpoint("net")
    assert epochs.begin(4) is False  # past the segment: the trainer stops
    assert loop.ended == "stopped"
    epochs.finish()
    assert [c[1] for c in loop.calls if c[0] == "epoch"] == [2, 3]
