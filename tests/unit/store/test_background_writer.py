"""flor.store.writer: the background writer never holds training up: it refuses work past its
memory budget instead of waiting, abandons whole at close, gives the training thread turns, and
hands a failure to ``on_error``.
"""

from __future__ import annotations

import threading
import time

from flor.store.writer import BackgroundWriter


def test_the_writer_gives_turns_and_the_training_thread_does_not():
    """``give_turn`` on the writer thread sleeps once ``TURN_S`` passed since its last turn (the
    moment a thread waiting for the GIL takes it), not at every call; on any other thread it
    does nothing."""
    from flor.store import writer as writer_module

    seen: list = []

    def job():
        pace = writer_module._pace
        seen.append(pace.due)  # 0.0: a turn is due at once
        writer_module.give_turn()
        after_first = pace.due
        writer_module.give_turn()  # right after: not due yet
        seen.append((after_first > 0, pace.due == after_first))
        deadline = time.perf_counter() + 5 * writer_module.TURN_S
        while time.perf_counter() < deadline:
            pass
        writer_module.give_turn()  # due again: a new turn
        seen.append(pace.due > after_first)

    w = writer_module.BackgroundWriter(budget=10)
    w.try_submit(job, 0, lambda exc: seen.append(exc))
    assert w.close(timeout=30) == [] and seen == [0.0, (True, True), True]
    writer_module.give_turn()
    assert getattr(writer_module._pace, "due", None) is None, "the training thread takes no turns"


def test_writer_refuses_past_its_budget_and_never_waits():
    w = BackgroundWriter(budget=100)
    gate = threading.Event()
    assert w.try_submit(gate.wait, 60, print, label=("b", 0))
    assert not w.has_room(60) and not w.try_submit(lambda: None, 60, print, label=("b", 1))
    assert w.try_submit(lambda: None, 40, print, label=("b", 2))  # fits beside it
    w.submit(lambda: None, 0, print)  # small jobs always queue
    gate.set()
    assert w.close(timeout=30) == []
    big = BackgroundWriter(budget=10)
    assert big.try_submit(lambda: None, 1000, print)  # nothing queued: a snapshot larger than the budget still goes
    assert big.close(timeout=30) == []


def test_writer_close_abandons_whole_after_the_timeout():
    w = BackgroundWriter()
    started, gate, ran, committed = threading.Event(), threading.Event(), [], []

    def slow() -> None:
        started.set()
        gate.wait()
        if w.may_commit():  # the manifest would be written here
            committed.append(1)

    assert w.try_submit(slow, 1, print, label=("train", 0))
    assert w.try_submit(lambda: ran.append(1), 1, print, label=("train", 1))
    started.wait(30)
    assert w.close(timeout=0.05) == [("train", 0), ("train", 1)]  # running and queued: both abandoned
    gate.set()
    w._thread.join(30)
    assert committed == [] and ran == []  # no manifest after abandonment; the queued job never ran
    assert w.close(timeout=1) == []  # safe to call twice
    assert not w.try_submit(lambda: None, 1, print)


def test_writer_failure_reaches_on_error_not_the_caller():
    w = BackgroundWriter()
    errors = []
    assert w.try_submit(lambda: 1 / 0, 1, errors.append)
    assert w.flush(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    w.close()
