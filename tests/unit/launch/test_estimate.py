"""flor.launch.estimate: the probed blocks a launch reads from the script."""

from __future__ import annotations

from pathlib import Path

import pytest

from flor.launch.estimate import probed_blocks


@pytest.mark.parametrize("source, expected", [
    ('flor.SkipBlock.step_into("a")', set()),
    ('flor.SkipBlock.step_into("a", probed=True)', {"a"}),
    ('flor.SkipBlock.step_into("a", probed=False)\nflor.SkipBlock.step_into("b", probed=args.p)', {"b"}),
    ('flor.SkipBlock.step_into(name, probed=True)', True),
])
def test_probed_blocks_are_read_from_the_script(tmp_path, source, expected):
    script = tmp_path / "s.py"
    script.write_text(source)
    assert probed_blocks(script) == expected
    assert probed_blocks(Path(tmp_path / "missing.py")) == set()


def test_workers_estimated_slower_than_fewer_are_named():
    """`flor replay --workers 2` on 2 CPU cores was 13.0 s against 3.8 s with one worker (start-up
    dominated); the launcher now says so (FL504) when its own estimate sees it."""
    from flor.launch.estimate import ReplayEstimate
    from flor.plan import BlockCost, EpochCost, estimate, fastest

    costs = [EpochCost(0.05, (BlockCost("train", 0.4, 0.01, True),))] * 6  # cheap outer-loop epochs
    restorable = set(range(6))
    kw = {"startup_s": 3.0, "probed": False}
    share = {1: 1.0, 2: 1.9}  # two workers of 2 threads each on 2 cores
    by_count = {n: max(estimate(costs, n, restorable, slowdown=share[n], **kw)) for n in (1, 2)}
    best = fastest(costs, restorable, max_workers=2, slowdown=share.__getitem__, **kw)
    two = ReplayEstimate(2, [], estimate(costs, 2, restorable, slowdown=1.9, **kw), best, by_count, 3.0, "", set(), 1.9, 2)
    assert best[0] == 1 and "--workers 2: estimated" in two.slower_than_fewer()
    one = ReplayEstimate(1, [], estimate(costs, 1, restorable, **kw), best, by_count, 3.0, "", set(), 1.0, 2)
    assert one.slower_than_fewer() is None
    # probed replays of long epochs, a thread a worker: two workers are faster, nothing to say
    long = [EpochCost(0.05, (BlockCost("train", 5.0, 0.01, True),))] * 6
    kw["probed"] = True
    share = {1: 1.0, 2: 1.0}
    by_count = {n: max(estimate(long, n, restorable, slowdown=share[n], **kw)) for n in (1, 2)}
    best = fastest(long, restorable, max_workers=2, slowdown=share.__getitem__, **kw)
    assert best[0] == 2
    assert ReplayEstimate(2, [], [by_count[2]], best, by_count, 3.0, "", set(), 1.9, 2).slower_than_fewer() is None
