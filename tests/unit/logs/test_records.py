"""flor.logs: a record's key (its step's type counts) and value equality, and the newest of
several records of one key.
"""

from __future__ import annotations

import pytest

from flor.logs import merge_newest, record_key, same_value

# -- record keys and value equality ---------------------------------------------------------------

@pytest.mark.parametrize("a, b, same, exact", [
    (float("nan"), float("nan"), True, True),
    (1, 1.0, True, False),
    (1, True, False, False),
    (True, True, True, True),
    (0.5, 0.75, False, False),
    ("1", 1, False, False),
    (None, None, True, True),
    ([1, 2], [1, 2], True, True),
])
def test_same_value(a, b, same, exact):
    assert same_value(a, b) is same and same_value(b, a) is same
    assert same_value(a, b, exact_type=True) is exact


@pytest.mark.parametrize("step_a, step_b, same", [
    (3, 3, True), (3, 3.0, False), (1, True, False), ("3", 3, False), (None, None, True),
    ([1, 2], [1, 2], True), ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
])
def test_record_key_step_rule(step_a, step_b, same):
    a = {"run": "r", "name": "x", "epoch": 0, "step": step_a}
    b = {"run": "r", "name": "x", "epoch": 0, "step": step_b}
    assert (record_key(a) == record_key(b)) is same


def test_merge_newest_uses_the_record_key():
    recs = [{"run": "r", "source": "record", "name": "x", "epoch": 0, "step": [1, 2], "k": 0, "value": 1, "t": 1},
            {"run": "r", "source": "replay", "name": "x", "epoch": 0, "step": [1, 2], "k": 0, "value": 2, "t": 2},
            {"run": "r", "source": "replay", "name": "x", "epoch": 0, "step": 1.0, "k": 0, "value": 3, "t": 2},
            {"run": "r", "source": "record", "name": "x", "epoch": 0, "step": 1, "k": 0, "value": 4, "t": 1}]
    assert [r["value"] for r in merge_newest(recs)] == [2, 3, 4]
