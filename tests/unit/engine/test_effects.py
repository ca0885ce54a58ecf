"""flor.engine.effects: the files a script writes itself, seen through open() and torch.save."""

from __future__ import annotations

import torch

from flor.engine.effects import MOST, FileWrites, recorded_writes


def test_writes_outside_the_store_are_noted_and_a_watched_one_is_told_once(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    told: list[str] = []
    ckpt = str(tmp_path / "ckpt.pt")
    writes = FileWrites([store], watched=[ckpt], seen=told.append)
    try:
        (tmp_path / "data.txt").write_text("read below")
        (tmp_path / "data.txt").read_text()  # reading is no write
        (store / "run.json").write_text("{}")  # flor's own files are left out
        torch.save({"step": 1}, ckpt)  # opened in C++: seen through the wrapper
        torch.save({"step": 2}, ckpt)
    finally:
        writes.close()
    assert writes.paths == [str(tmp_path / "data.txt"), ckpt] and told == [ckpt]
    assert getattr(torch.save, "__wrapped__", None) is None  # closed: torch.save is torch's again
    (tmp_path / "after.txt").write_text("")
    assert str(tmp_path / "after.txt") not in writes.paths


def test_recorded_writes_reads_strings_only():
    assert recorded_writes({"files_written": ["/a", 3, None, "/b"]}) == ["/a", "/b"]
    assert recorded_writes({"files_written": "/a"}) == [] and recorded_writes({}) == []
    assert len(recorded_writes({"files_written": ["/x"] * (MOST + 5)})) == MOST
