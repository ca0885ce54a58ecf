"""The replay plan: every epoch exactly once, initialization from the nearest checkpoint."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flor.plan import block_action, init_start, make_plan, segment


@pytest.mark.parametrize(
    "epochs, ngpus, expected",
    [
        (10, 1, [range(0, 10)]),
        (10, 2, [range(0, 5), range(5, 10)]),
        (5, 2, [range(0, 2), range(2, 5)]),
        (200, 200, [range(i, i + 1) for i in range(200)]),
        (3, 5, [range(0, 0), range(0, 1), range(1, 1), range(1, 2), range(2, 3)]),
        (0, 2, [range(0, 0), range(0, 0)]),
    ],
)
def test_segments(epochs, ngpus, expected):
    assert [segment(epochs, p, ngpus) for p in range(ngpus)] == expected


def test_tenth_epoch_of_two_hundred():
    assert list(segment(200, 9, 200)) == [9]


@given(
    epochs=st.integers(0, 80),
    ngpus=st.integers(1, 20),
    data=st.data(),
    strong=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_plans_cover_every_epoch_exactly_once(epochs, ngpus, data, strong):
    restorable = data.draw(st.sets(st.integers(0, max(epochs - 1, 0))))
    seen: list[int] = []
    for pid in range(ngpus):
        plan = make_plan(epochs, pid, ngpus, restorable, strong=strong)
        seen.extend(plan.segment)
        if len(plan.segment) == 0:
            assert len(plan.init) == 0
            continue
        a = plan.segment.start
        # initialization ends right where the segment starts ...
        assert plan.init.stop == a or len(plan.init) == 0
        # ... and starts from a state that is known exactly: the loop's start, or a checkpoint
        assert plan.first == 0 or plan.first in restorable
        if strong:
            assert plan.first == 0
        else:
            # the nearest checkpoint: no restorable epoch between it and the segment
            assert not any(plan.first < e < a for e in restorable)
        assert all(plan.runs(e) for e in range(plan.first, plan.stop))
        assert not plan.runs(plan.stop)
        assert all(plan.reports(e) == (e in plan.segment) for e in range(epochs))
    assert sorted(seen) == list(range(epochs))


def test_sparse_checkpoints_initialize_from_nearest_earlier():
    plan = make_plan(10, 1, 2, restorable={0, 3, 6, 9})
    assert (list(plan.init), list(plan.segment)) == ([3, 4], [5, 6, 7, 8, 9])
    plan = make_plan(10, 1, 2, restorable=set())
    assert list(plan.init) == [0, 1, 2, 3, 4]
    plan = make_plan(10, 1, 2, restorable={4}, strong=True)
    assert list(plan.init) == [0, 1, 2, 3, 4]
    assert init_start(0, {0, 1}) == 0


@pytest.mark.parametrize(
    "checkpointed, probed, initializing, action",
    [
        (True, False, False, "restore"),
        (True, True, False, "execute"),
        (True, True, True, "restore"),
        (False, False, False, "execute"),
        (False, True, True, "execute"),
        (False, False, True, "execute"),
    ],
)
def test_block_action(checkpointed, probed, initializing, action):
    assert block_action(checkpointed=checkpointed, probed=probed, initializing=initializing) == action
