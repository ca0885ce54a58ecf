"""The checkpoint policy (flor.policy): pure bookkeeping, no training, no timing."""

from flor.policy import CHARGE_IDLE, CHARGE_SHARED, CheckpointPolicy


def schedule(charge: str, *, epoch_s: float, stall: float, background: float, held: float = 0.0,
             epochs: int = 20) -> list[int]:
    p = CheckpointPolicy(overhead=0.01, charge=charge)
    elapsed = 0.0
    for epoch in range(epochs):
        elapsed += epoch_s
        if p.due("train", epoch, elapsed=elapsed):
            p.observe("train", epoch, stall=stall)
            p.observe_background("train", background, held=held)
            elapsed += stall + (background if charge == CHARGE_SHARED else held)
    return p.checkpointed


def test_shared_cores_charge_the_background_share():
    # stall 0.5% of an epoch, background share 2%: only the stall fits a 1% budget
    stall_only = schedule(CHARGE_IDLE, epoch_s=1.0, stall=0.005, background=0.02)
    shared = schedule(CHARGE_SHARED, epoch_s=1.0, stall=0.005, background=0.02)
    assert stall_only == list(range(20))
    assert 0 in shared and 2 <= len(shared) <= 20 * 0.01 / 0.025 + 2
    assert len(shared) < len(stall_only)


def test_charged_cost_stays_within_the_budget():
    p = CheckpointPolicy(overhead=0.01, charge=CHARGE_SHARED)
    elapsed = 0.0
    for epoch in range(200):
        elapsed += 1.0
        if p.due("train", epoch, elapsed=elapsed):
            p.observe("train", epoch, stall=0.004)
            p.observe_background("train", 0.016)
            elapsed += 0.02
    training = elapsed - p.charged_s
    assert p.charged_s <= 0.01 * training + 0.02  # at most one checkpoint over
    assert p.charged_s >= 0.01 * training - 0.04  # and the budget is used, not wasted


def test_an_idle_core_charges_the_stall_and_the_writers_gil_time():
    p = CheckpointPolicy(overhead=0.01, charge=CHARGE_IDLE)
    p.observe("train", 0, stall=0.001)
    p.observe_background("train", 5.0, held=0.002)  # its I/O is large, but on an idle core: not wall time
    assert p.charged_s == 0.003
    assert not p.due("train", 1, elapsed=0.5) and p.due("train", 2, elapsed=0.7)  # 0.003 + 0.003 <= 1% of ~0.7 s
    d = p.describe()
    assert d["charged"] == CHARGE_IDLE and d["background_share_s"] == 5.0 and d["gil_s"] == 0.002
    assert d["charged_s"] == 0.003
    # the GIL time thins a schedule the stall alone would not
    assert schedule(CHARGE_IDLE, epoch_s=1.0, stall=0.005, background=0.5, held=0.01) != list(range(20))


def test_with_a_core_idle_the_gil_time_is_charged_as_far_as_training_waited_for_it():
    p = CheckpointPolicy(overhead=0.01, charge=CHARGE_IDLE)
    assert p.observe_background("train", 0.05, held=0.004, waited=0.001, first=True) == 0.001  # inside torch's code
    assert p.observe_background("train", 0.05, held=0.004, waited=None) == 0.004  # no thread clock: all of it
    assert p.observe_background("train", 0.05, held=0.002, waited=0.009) == 0.002  # waited on more than the writer
    d = p.describe()
    assert d["gil_s"] == 0.010 and d["gil_waited_s"] == 0.007 and d["charged_s"] == 0.007
    assert p.held["train"] == 0.002  # the last charge is the estimate for the next checkpoint
    p.charge = CHARGE_SHARED  # every core busy: all of the writer's CPU, whatever training waited
    assert p.describe()["charged_s"] == 0.15


def test_describe_says_what_was_charged():
    p = CheckpointPolicy()
    p.observe("train", 0, stall=0.25)
    p.observe_background("train", 0.5)
    d = p.describe()
    assert d["charged"] == CHARGE_SHARED and "cores shared" in d["charged"]
    assert d["charged_s"] == 0.75 and d["checkpointed_epochs"] == [0]


def test_fixed_schedule_ignores_costs():
    p = CheckpointPolicy(every=3)
    p.observe("train", 0, stall=100.0)
    assert [e for e in range(7) if p.due("train", e, elapsed=1.0)] == [0, 3, 6]
    assert p.skipped == [1, 2, 4, 5]


def test_blocks_outside_the_loop_always_run():
    p = CheckpointPolicy(overhead=0.0)
    p.observe("init", None, stall=10.0)
    assert p.due("init", None, elapsed=0.0)


def test_a_blocks_first_checkpoint_is_charged_but_is_no_estimate():
    """The first checkpoint of a block pays one-time work (the full encoding, learning the
    block's structure, first buffers): ~4x the later ones on the digits CNN. Taken as the
    estimate, it kept the next checkpoint waiting until the budget could pay for a second
    such one; now the next is taken once the first is paid for, and the run stays within
    budget but for one checkpoint."""
    def run(first_is_estimate: bool) -> tuple[list[int], CheckpointPolicy, float]:
        p = CheckpointPolicy(overhead=0.01, charge=CHARGE_IDLE)
        elapsed = 0.0
        for epoch in range(40):
            elapsed += 0.09  # the CNN's epoch
            if p.due("train", epoch, elapsed=elapsed):
                first = not p.checkpointed
                cost = 0.004 if first else 0.0008
                p.observe("train", epoch, stall=cost / 2, first=first and not first_is_estimate)
                p.observe_background("train", cost, held=cost / 2, first=first and not first_is_estimate)
                elapsed += cost
        return p.checkpointed, p, elapsed

    now, p, elapsed = run(False)
    before, _, _ = run(True)
    assert now[:2] == [0, 4], "the second once the first's 4 ms are within 1% of training"
    assert before[1] > now[1] and len(now) > len(before)
    training = elapsed - p.charged_s
    assert p.charged_s <= 0.01 * training + 0.0008  # within budget but for one checkpoint
    assert len(now) >= 30


def test_the_probes_are_charged_but_never_keep_a_block_from_its_first_checkpoint():
    """The probes of the script's state outside end() run at every block run on the training
    thread (flor.watch): their time is charged, so later checkpoints thin out sooner, but a
    block's first checkpoint is taken to measure it even when they alone exceed the budget."""
    p = CheckpointPolicy(overhead=0.01)
    p.observe_watch(0.5)  # 5% of the first 10 s
    assert p.charged_s == 0.5 and p.describe()["watch_s"] == 0.5
    assert p.due("train", 0, elapsed=10.0)
    p.observe("train", 0, stall=0.01)
    assert not p.due("train", 1, elapsed=20.0)  # 0.51 s spent of 0.2 s allowed
    assert p.due("train", 2, elapsed=70.0)


def replay_weighed(*, epoch_s: float, cost: float, epochs: int = 20, overhead: float = 0.01,
                   payback: bool = True) -> CheckpointPolicy:
    """A schedule where the block is the whole epoch and each checkpoint costs ``cost`` (shared cores)."""
    p = CheckpointPolicy(overhead=overhead, charge=CHARGE_SHARED)
    elapsed = 0.0
    for epoch in range(epochs):
        elapsed += epoch_s
        if p.due("train", epoch, elapsed=elapsed, run_s=epoch_s if payback else None):
            p.observe("train", epoch, stall=cost / 4, first=epoch == 0)
            p.observe_background("train", cost * 3 / 4, first=epoch == 0)
            elapsed += cost
    return p


def test_a_checkpoint_that_saves_a_replay_twenty_times_its_cost_is_kept_past_the_budget():
    # 3% of its block: over a 1% budget, but a replay that restores it skips 33x its cost
    p = replay_weighed(epoch_s=1.0, cost=0.03)
    budget_only = replay_weighed(epoch_s=1.0, cost=0.03, payback=False)
    assert len(budget_only.checkpointed) <= 8  # the budget alone thins it out
    # the first is taken, the second once the first is paid for (it is no estimate), the rest pay back
    assert p.checkpointed == [0, *range(2, 20)] and p.skipped == [1]
    assert p.for_replay == list(range(3, 20))
    training = 20 * 1.0
    assert 0.01 * training < p.charged_s <= 0.05 * training  # past the budget, under its ceiling
    d = p.describe()
    assert d["replay_epochs"] == list(range(3, 20)) and d["payback"] == 20 and d["ceiling"] == 0.05
    line = p.summary(training + p.charged_s)
    assert line.startswith("checkpointed 19 of 20 epochs") and "17 past it" in line and "up to 5.0%" in line


def test_a_checkpoint_that_does_not_pay_back_stays_within_the_budget():
    # 8% of its block: a replay saves only 11x its cost; thinned to the 1% budget as before
    p = replay_weighed(epoch_s=1.0, cost=0.08)
    assert p.for_replay == []
    assert p.checkpointed == replay_weighed(epoch_s=1.0, cost=0.08, payback=False).checkpointed
    assert 2 <= len(p.checkpointed) <= 5


def test_the_ceiling_follows_the_budget():
    # a tenth of the default budget: paying back may cost at most five of those budgets (0.5%)
    p = replay_weighed(epoch_s=1.0, cost=0.03, overhead=0.001, epochs=60)
    assert p.for_replay and p.skipped
    assert p.charged_s <= 0.005 * 60 + 0.03 + 0.03  # the first, and at most one over
    assert len(p.checkpointed) < len(replay_weighed(epoch_s=1.0, cost=0.03, epochs=60).checkpointed)


def test_a_fixed_schedule_is_not_weighed():
    p = CheckpointPolicy(overhead=0.01, every=3)
    assert [e for e in range(9) if p.due("train", e, elapsed=float(e + 1), run_s=1.0)] == [0, 3, 6]
    assert p.for_replay == []


def test_an_epoch_refused_after_due_is_not_counted_as_kept_for_replay():
    """The recording refuses a due checkpoint where the loop's variables were not noted before the
    epoch (flor.engine.record): the exit line's "N past it" counts only the epochs kept."""
    p = CheckpointPolicy(overhead=0.01)
    p.observe("train", 0, stall=0.03)
    assert p.due("train", 1, elapsed=2.0, run_s=1.0) and p.for_replay == [1]
    p.refused(1)
    assert p.for_replay == [] and p.skipped == [1]
