"""flor.store.journal: the spool journal ignores a torn last line."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="the S3 tests need boto3 and moto[server]: pip install -e '.[test]'")
pytest.importorskip("moto.server", reason="the S3 tests need moto[server]: pip install -e '.[test]'")


def test_journal_ignores_a_torn_last_line(tmp_path: Path) -> None:
    from flor.store.journal import SpoolJournal

    journal = SpoolJournal(tmp_path, "s3://bucket/p")
    journal.add("objects/ab/cd", 10, "abcd")
    journal.close()
    with open(journal.path, "a") as fh:
        fh.write('{"k": "objects/ef/gh", "n": 1')  # the process died mid-line
    again = SpoolJournal(tmp_path, "s3://bucket/p")
    assert again.has("objects/ab/cd") and again.has("objects/ab/cd", 10, "abcd")
    assert not again.has("objects/ab/cd", 11) and not again.has("objects/ef/gh")
    assert SpoolJournal(tmp_path, "s3://bucket/other").path != journal.path  # one journal per target
