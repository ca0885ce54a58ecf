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


# -- epoch selection and the cost model (flor replay --epochs, --plan) ---------------------

from flor.plan import BlockCost, EpochCost, epoch_seconds, estimate, fastest, restorable_epochs, select  # noqa: E402


@pytest.mark.parametrize("epochs, epoch_range, expected", [
    (10, None, range(10)), (10, (4, 7), range(4, 7)), (10, (8, None), range(8, 10)),
    (10, (8, 50), range(8, 10)), (10, (12, 20), range(10, 10)), (10, (0, 1), range(0, 1)),
])
def test_select(epochs, epoch_range, expected):
    assert select(epochs, epoch_range) == expected


@given(epochs=st.integers(1, 60), ngpus=st.integers(1, 12), data=st.data())
@settings(max_examples=200, deadline=None)
def test_selected_epochs_are_covered_exactly_once(epochs, ngpus, data):
    a = data.draw(st.integers(0, epochs - 1))
    b = data.draw(st.integers(a + 1, epochs))
    restorable = data.draw(st.sets(st.integers(0, epochs - 1)))
    plans = [make_plan(epochs, p, ngpus, restorable, within=range(a, b)) for p in range(ngpus)]
    assert sorted(e for p in plans for e in p.segment) == list(range(a, b))
    for p in plans:
        if len(p.segment):
            assert p.first == 0 or p.first in restorable  # rebuilt from a known state ...
            assert not any(p.first < e < p.segment.start for e in restorable)  # ... the nearest one
    # values after the loop are exact only when the selection reaches the end
    assert [p.reports_after for p in plans].count(True) == (1 if b == epochs else 0)


def test_restorable_epochs_need_every_block():
    blocks = {"0": [["a", 0], ["b", 0]], "1": [["a", 0]], "2": [], "3": [["a", 0], ["a", 1]]}
    available = {("a", 0, 0), ("b", 0, 0), ("a", 1, 0), ("a", 3, 0)}
    assert restorable_epochs(blocks, available) == {0, 1}


COSTS = [EpochCost(0.5, (BlockCost("train", 10.0, 0.25, True),)) for _ in range(8)]


def test_estimate_follows_block_actions():
    # restored epochs cost outer + restore; probed ones outer + run + check
    assert estimate(COSTS, 1, range(8), startup_s=2.0) == [2.0 + 8 * 0.75]
    assert estimate(COSTS, 1, range(8), startup_s=2.0, probed=True) == [2.0 + 8 * 10.75]
    # worker 1 of 2 initializes epoch 3 (restored, even when probed) then probes 4-7
    assert estimate(COSTS, 2, range(8), startup_s=2.0, probed={"train"}) == [2.0 + 4 * 10.75, 2.0 + 0.75 + 4 * 10.75]
    # without checkpoints worker 1 re-executes epochs 0-3 first
    bare = [EpochCost(0.5, (BlockCost("train", 10.0, 0.25, False),)) for _ in range(8)]
    assert estimate(bare, 2, set(), startup_s=0.0)[1] == 8 * 10.5
    assert epoch_seconds(COSTS[0], probed={"other"}, initializing=False) == 0.75


def test_fastest_weighs_startup_and_sharing():
    # probed epochs dominate: more workers help, up to the cores (slowdown past 4)
    n, t = fastest(COSTS, range(8), startup_s=2.0, max_workers=8, probed=True,
                   slowdown=lambda n: max(1.0, n / 4))
    assert (n, t) == (4, 2.0 + 0.75 + 2 * 10.75)
    # restored epochs are cheap: startup dominates, and on 2 cores a third worker only adds sharing
    assert fastest(COSTS, range(8), startup_s=2.0, max_workers=8, slowdown=lambda n: max(1.0, n / 2)) == (2, 5.75)


def test_fastest_takes_more_workers_only_when_clearly_faster():
    """`flor replay` without --workers took 2 workers where the estimate saw a small gain and
    start-up under contention made them slower than one (13.0 s against 3.8 s): a count is now
    taken only when estimated FASTER_BY faster than fewer."""
    from flor.plan import FASTER_BY

    costs = [EpochCost(0.1, (BlockCost("train", 1.0, 0.05, True),))] * 12
    # two workers 10% faster on paper (start-up 1 s each, 12 cheap restored epochs): one is kept
    one = estimate(costs, 1, range(12), startup_s=1.0)[0]
    slow = 0.9 * one / max(estimate(costs, 2, range(12), startup_s=1.0))  # leaves two workers 10% ahead
    two = max(estimate(costs, 2, range(12), startup_s=1.0, slowdown=slow))
    assert slow > 1.0
    assert two < one and two > one * (1 - FASTER_BY)
    assert fastest(costs, range(12), startup_s=1.0, max_workers=2, slowdown=lambda n: slow if n == 2 else 1.0)[0] == 1
    # clearly faster (no sharing): two
    assert fastest(costs, range(12), startup_s=0.5, max_workers=2, probed=True)[0] == 2


def test_start_up_is_stretched_as_one_thread_a_worker():
    """Two workers of 2 torch threads on 2 cores run their epochs at half speed, but start (the
    interpreter, imports) one thread each: stretching start-up like the epochs doubled it in the
    estimate, and the launch record's measured start-up was then halved for the next --plan."""
    costs = [EpochCost(0.1, (BlockCost("train", 1.0, 0.05, True),))] * 4
    both = estimate(costs, 2, range(4), startup_s=3.0, slowdown=2.0)
    apart = estimate(costs, 2, range(4), startup_s=3.0, slowdown=2.0, startup_slowdown=1.0)
    assert [round(b - a, 6) for b, a in zip(both, apart)] == [3.0, 3.0]
    assert fastest(costs, range(4), startup_s=3.0, max_workers=2, slowdown=lambda n: float(n),
                   startup_slowdown=lambda n: 1.0) == (1, max(estimate(costs, 1, range(4), startup_s=3.0)))
