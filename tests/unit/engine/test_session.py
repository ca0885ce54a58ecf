"""flor.engine.session: what record and replay share; here the output log's epoch marks, kept as
numbers between writes (a loop of short epochs) and written, in order, before any other mark, when
``flush_marks`` is called (a signal) and when the output is closed."""

from __future__ import annotations

import json
from pathlib import Path

from sessions import isolated, script_copy, settings

from flor.engine.record import RecordSession
from flor.engine.session import marks_path


def _marks(session: RecordSession) -> list[dict]:
    path = marks_path(session.layout.stdout)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_epoch_marks_are_written_in_order_with_the_offsets_where_each_epoch_began(tmp_path: Path) -> None:
    with isolated(script_copy(tmp_path, __file__)) as made:
        session = RecordSession(settings(tmp_path, "record", every=10**9))
        made.append(session)
        session.loop_frame, session.loop_wrapper = None, None
        loop = session.iterate(range(5))
        for epoch in loop:
            if epoch == 2:
                print("two")  # through the tee: epoch 3 begins 4 bytes later
                written = [m["epoch"] for m in _marks(session) if m["mark"] == "epoch"]
                assert written in ([], [0, 1], [0, 1, 2]), written  # kept (up to MARKS_EVERY_S), else all, in order
            if epoch == 3:
                session.flush_marks()  # a signal: every mark so far reaches the file
                assert [m["epoch"] for m in _marks(session) if m["mark"] == "epoch"] == [0, 1, 2, 3]
        session.close()
    marks = _marks(session)
    assert [m["mark"] for m in marks] == ["start", "epoch", "epoch", "epoch", "epoch", "epoch", "after", "end"]
    epochs = [m for m in marks if m["mark"] == "epoch"]
    assert [m["epoch"] for m in epochs] == [0, 1, 2, 3, 4]
    assert [m["at"] for m in epochs] == [0, 0, 0, 4, 4]  # the log's offset where each epoch began
    assert [m["t"] for m in marks] == sorted(m["t"] for m in marks)
    assert session.layout.stdout.read_text().startswith("two\n")
