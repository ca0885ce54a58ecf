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


def _runs_with_launches(tmp_path, extras):
    """A store with one run per item of ``extras``, each with a launch record holding that
    ``replay_extra_s`` (None: a record without it)."""
    import json

    from flor.store import ExperimentStore
    from flor.engine.session import new_run_id

    store = ExperimentStore(tmp_path, "exp")
    runs = []
    for i, extra in enumerate(extras):
        run = new_run_id()
        logs = store.run_path(run) / "logs"
        logs.mkdir(parents=True)
        (logs.parent / "run.json").write_text("{}")  # what makes the folder a run (its content unread here)
        rec = {"replay": f"r{i}", "status": "finished", "host": "h", "started": 100.0 + i, "slowdown": 1.0,
               "pid": 1, "workers": 1, "segments": []}
        if extra is not None:
            rec["replay_extra_s"] = extra
        (logs / f"launch-r{i}.json").write_text(json.dumps(rec))
        runs.append(run)
    return store, runs


def test_a_replay_adds_to_the_recordings_start_up_what_the_experiments_last_launch_measured(tmp_path):
    """The recording's start-up misses its interpreter's teardown (after its last flor call) and a
    replay's own set-up: the first --plan of a run read 0.62-0.82 of its launch. A launch keeps
    what its workers spent beyond the recording's figure; the first plan of another run adds it."""
    from flor.launch.estimate import DEFAULT_REPLAY_EXTRA_S, replay_extra

    store, runs = _runs_with_launches(tmp_path, [0.9, None, None])
    extra, why = replay_extra(store, runs[2])
    assert extra == 0.9 and runs[0] in why
    assert replay_extra(store, runs[0]) == (DEFAULT_REPLAY_EXTRA_S, "assumed")  # its own launch does not count
    # a planted record: not a number, negative, absurd: the default, never the planted value
    for bad in ("0.9", -1.0, 1e9, True):
        store, runs = _runs_with_launches(tmp_path / repr(bad), [bad, None])
        assert replay_extra(store, runs[1]) == (DEFAULT_REPLAY_EXTRA_S, "assumed")


def test_a_launch_keeps_what_its_workers_spent_beyond_the_recordings_start_up():
    from types import SimpleNamespace

    from flor.launch.launcher import Launch
    from flor.launch.workers import WorkerState

    def worker(spawned, first, after, exited, skipped=False):
        return SimpleNamespace(skipped=skipped, fixed_s=WorkerState.fixed_s.__get__(SimpleNamespace(
            spawned=spawned, first_epoch=first, loop_end=after, exited=exited)))

    launch = SimpleNamespace(estimate=SimpleNamespace(recorded_startup_s=1.5, startup_slowdown=1.0),
                             states=[worker(1.0, 3.0, 4.0, 5.0), worker(1.0, 3.5, 4.5, 6.0), worker(0, 0, 0, 0, True)])
    assert Launch._replay_extra(launch) == 2.5  # outside their epochs 3.0 and 4.0 s: the median (the higher), less 1.5
    launch.estimate.startup_slowdown = 2.0  # two workers' start-ups sharing one core: per unit of sharing
    assert Launch._replay_extra(launch) == 0.5
    launch.estimate.recorded_startup_s = None  # a recording without marks: nothing to compare with
    assert Launch._replay_extra(launch) is None


def test_the_launchers_own_time_is_in_the_total_and_the_load_is_sampled_once(monkeypatch):
    """A launch's wall time includes the launcher's start (interpreter, imports, the estimate:
    ~0.5 s against workers of ~5 s on the 2-core VM); the load's 0.2 s sample is taken once when
    a launch estimates twice (the worker count, then its plan)."""
    import flor.launch.estimate as estimate
    from flor.launch.estimate import ReplayEstimate, launcher_s, load

    est = ReplayEstimate(1, [], [4.0], (1, 4.0), {1: 4.0}, 2.0, "", set(), 1.0, 1)
    assert est.total_s == 4.0
    est.launcher_s = 0.5
    assert est.total_s == 4.5
    assert 0.0 < launcher_s()  # this process has run for a while
    calls = []
    monkeypatch.setattr(estimate, "busy_cores", lambda samples: calls.append(samples) or 1.5)
    monkeypatch.setattr(estimate, "_LOAD", None)
    assert load() == load() == 1.5 and len(calls) == 1
    monkeypatch.setattr(estimate, "_LOAD", (estimate._LOAD[0] - estimate.LOAD_KEPT_S - 1, 1.5))  # an old sample
    assert load() == 1.5 and len(calls) == 2
