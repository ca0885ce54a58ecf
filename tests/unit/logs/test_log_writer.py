"""The log buffer behind flor.log: what a record's line holds, and that every value is written
exactly once however adds and flushes interleave (threads, a signal handler's flush), and once
more after a write that failed."""

from __future__ import annotations

import json
import threading
from collections import deque
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from flor.logs import LogWriter, json_line

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
names = st.text(min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(name=names, value=scalars, epoch=st.one_of(st.none(), st.integers(0, 10**6)),
       step=st.one_of(st.none(), st.integers(-2**63, 2**63)), block=st.one_of(st.none(), names),
       t=st.floats(0, 4e9), loop=st.sampled_from([None, "before", "after"]))
def test_a_line_is_json_dumps_of_the_record(name, value, epoch, step, block, t, loop):
    rec = {"name": name, "value": value, "epoch": epoch, "step": step, "block": block, "t": t}
    if loop is not None:
        rec["loop"] = loop
    assert json_line(name, value, epoch, step, block, t, loop) == json.dumps(rec)


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_values_added_from_threads_while_flushing_are_written_once_in_order(tmp_path):
    w = LogWriter(tmp_path / "logs.jsonl")
    per_thread = 20_000

    def add(k: int) -> None:
        for i in range(per_thread):
            w.add(f"t{k}", i, 0, i, None)

    threads = [threading.Thread(target=add, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        w.flush()
    w.flush()
    recs = lines(tmp_path / "logs.jsonl")
    for k in range(2):
        assert [r["value"] for r in recs if r["name"] == f"t{k}"] == list(range(per_thread))


def test_a_flush_interrupted_by_another_flush_loses_and_repeats_nothing(tmp_path):
    """A signal handler (SIGTERM: flush and exit) may flush while the training thread is
    inside a flush; the inner one takes what is left, the outer one stops there."""
    w = LogWriter(tmp_path / "logs.jsonl")

    class Interrupted(deque):
        taken = 0

        def popleft(self):
            Interrupted.taken += 1
            if Interrupted.taken == 3:
                w.flush()  # as a handler would, between two of the outer flush's steps
            return super().popleft()

    w._buffer = Interrupted()
    for i in range(10):
        w.add("x", i, 0, i, None)
    w.flush()
    assert sorted(r["value"] for r in lines(tmp_path / "logs.jsonl")) == list(range(10))


def test_log_values_of_a_failed_write_are_written_when_the_disk_allows(tmp_path: Path):
    """A flush that cannot write (here the log's path is a directory) keeps its records; the
    next flush that can writes them first, in order, each once."""
    from flor.logs import LogWriter, read_jsonl

    path = tmp_path / "logs" / "record.jsonl"
    path.mkdir(parents=True)
    errors: list[int] = []
    writer = LogWriter(path, on_error=lambda exc, n: errors.append(n))
    for i in range(3):
        writer.add("loss", float(i), i, None, None)
    writer.flush()
    writer.add("loss", 3.0, 3, None, None)
    writer.flush()
    assert errors == [3, 1] and [r["value"] for r in writer.unwritten] == [0.0, 1.0, 2.0, 3.0]
    path.rmdir()
    writer.add("loss", 4.0, 4, None, None)
    writer.flush()
    writer.flush()
    assert [r["value"] for r in read_jsonl(path)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert writer.unwritten == [] and writer.lost == 0
