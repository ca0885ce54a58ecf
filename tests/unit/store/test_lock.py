"""flor.store.lock: recordings share the store's lock, a repair takes it alone."""

from __future__ import annotations

import pytest

from flor.store.lock import exclusive, release, shared


def test_a_repair_and_recordings_exclude_each_other(tmp_path) -> None:
    first, second = shared(tmp_path, wait=0.0), shared(tmp_path, wait=0.0)
    assert first is not None and second is not None  # recordings run side by side
    assert exclusive(tmp_path) is None  # a repair refuses while any records
    release(first)
    assert exclusive(tmp_path) is None
    release(second)
    repair = exclusive(tmp_path)
    assert repair is not None
    with pytest.warns(RuntimeWarning, match="FL419"):  # a recording that starts meanwhile goes on unlocked
        assert shared(tmp_path, wait=0.2) is None
    release(repair)
    assert (held := shared(tmp_path, wait=0.0)) is not None
    release(held)


def test_a_folder_that_cannot_be_opened_is_not_locked(tmp_path) -> None:
    assert shared(tmp_path / "missing", wait=0.0) is None and exclusive(tmp_path / "missing") is None
    release(None)
