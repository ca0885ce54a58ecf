"""Which epochs to checkpoint: every one while that fits the overhead budget, fewer when not.

Pure bookkeeping over measured times; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = ["CEILING", "CHARGE_IDLE", "CHARGE_SHARED", "IDLE_CORE", "PAYBACK", "CheckpointPolicy", "charge_for"]

#: what the budget is charged with, as run.json's ``checkpoint_policy.charged`` and the exit line say
CHARGE_SHARED = "stall + writer CPU (cores shared)"
CHARGE_IDLE = "stall + training's wait for the writer's GIL (a core idle beside training)"
#: idle cores (on average since the last reading) that count as one the writer may use
IDLE_CORE = 0.8
#: past the budget, an epoch is still checkpointed when a replay's saving is at least this many times its cost
PAYBACK = 20
#: ... while all checkpoints together cost at most this many times the budget (5% at the default 1%)
CEILING = 5
#: block runs without a checkpoint before FL122 may be said (``CheckpointPolicy.per_run_note``)
PER_RUN_MIN = 1000


def charge_for(idle: float | None) -> str:
    """The charge for ``idle`` cores read since the last reading (``flor.placement.IdleMeter``;
    None where they cannot be read): the writer's GIL time only where about a core sat idle.

    >>> charge_for(1.0) == CHARGE_IDLE, charge_for(0.3) == CHARGE_SHARED, charge_for(None) == CHARGE_SHARED
    (True, True, True)
    """
    return CHARGE_IDLE if idle is not None and idle >= IDLE_CORE else CHARGE_SHARED


@dataclass
class CheckpointPolicy:
    """Keep what checkpointing costs in wall time within ``overhead`` of training time.

    What counts (``charge``): always the training thread's stall. Where the writer shares the
    cores with training (every core was busy since the last checkpoint, ``CHARGE_SHARED``: CPU
    training with a thread per core, a GPU run whose DataLoader workers fill the cores, a busy
    node), all of the writer's CPU time. Where a core sat idle (``CHARGE_IDLE``: a GPU run, CPU
    training with fewer threads than cores), the writer's time holding the GIL (its Python
    work, packing, the manifest; not its system calls, nor hashing, which xxhash does with the
    GIL released), but no more than the training thread spent waiting while the writer
    worked: a hold that found training inside torch's own code, which releases the GIL, cost
    it nothing, and the writer's I/O runs on the idle core for free. Measured on the digits
    CNN, both charges are at or above what a checkpoint lengthened its epoch by
    (flor.engine.checkpointing, ``_choose_charge``). The cost of
    each block's last checkpoint is the estimate for its next one, and is measured again every
    time (model size, disk speed and contention change during a run). An epoch is checkpointed
    when the cost so far plus that estimate stays within budget; so an expensive checkpoint
    thins out the following ones into a regular period. A block's first checkpoint (``first``) pays
    one-time work: learning the block's structure (the fast walk checked against the full
    encoding), the first buffers, the template's text and folders (the digits CNN: a stall of
    ~2 ms and ~5 ms of the writer's GIL time, against ~0.6 and ~1.5 ms for the next ones); it
    is charged, but is no estimate, and no debt either: being taken whatever it costs, it does
    not thin out the next ones, whose own costs are weighed against the budget.

    The budget weighs only what a recording pays; a missing checkpoint costs every replay that
    passes the epoch a re-execution of the block (the original FLOR weighed restore against
    recompute). So past the budget an epoch is still checkpointed when its expected cost is at
    most 1/``PAYBACK`` of what it saves a replay (the block's last run, less a restore, estimated
    at what writing the checkpoint cost), while all checkpoints cost at most ``CEILING`` times
    the budget; those epochs are ``for_replay`` (run.json ``replay_epochs``, the exit line). Small
    models, whose checkpoints are a few milliseconds against seconds of training, stay dense;
    a checkpoint that costs a twentieth of its block or more never passes the budget.
    With ``every`` set, the schedule is fixed instead: epochs 0, N, 2N, ...

    >>> p = CheckpointPolicy(overhead=0.01)
    >>> p.due("train", 0, elapsed=10.0)   # nothing measured yet: measure
    True
    >>> p.observe("train", 0, stall=0.5)  # 5% of the 10 s so far
    >>> p.due("train", 1, elapsed=20.0), p.due("train", 9, elapsed=110.0)
    (False, True)
    >>> p = CheckpointPolicy(overhead=0.01)
    >>> p.observe("train", 0, stall=0.5, first=True)  # the first: its one-time work is charged, no debt
    >>> p.observe("train", 1, stall=0.01)
    >>> p.due("train", 2, elapsed=20.0), round(p.charged_s, 2)
    (True, 0.51)
    >>> p = CheckpointPolicy(overhead=0.01)           # CPU training: the writer's share counts
    >>> p.observe("train", 0, stall=0.01); _ = p.observe_background("train", 0.09)
    >>> p.due("train", 1, elapsed=10.0), p.due("train", 2, elapsed=30.0)
    (False, True)
    >>> p = CheckpointPolicy(overhead=0.01, charge=CHARGE_IDLE)  # a core idle: the GIL training waited for
    >>> p.observe("train", 0, stall=0.001); p.observe_background("train", 0.009, held=0.004, waited=0.001)
    0.001
    >>> round(p.charged_s, 6), p.describe()["gil_s"], p.describe()["gil_waited_s"]
    (0.002, 0.004, 0.001)
    >>> p = CheckpointPolicy(overhead=0.01)           # 3% of a 1 s block: past the budget, but pays back
    >>> p.observe("train", 0, stall=0.03)
    >>> p.due("train", 1, elapsed=2.0, run_s=1.0), p.due("train", 2, elapsed=3.0, run_s=0.5), p.for_replay
    (True, False, [1])
    """

    overhead: float = 0.01
    every: int | None = None
    charge: str = CHARGE_SHARED
    stall_s: float = 0.0
    background_s: float = 0.0
    held_s: float = 0.0  # the writer's GIL time (run.json gil_s)
    waited_s: float = 0.0  # of it, what is charged: as far as training waited (gil_waited_s)
    watch_s: float = 0.0  # the probes of the script's state outside end() (flor.watch), on the training thread
    #: of it, what every block run pays, checkpointed or not (all but the noting a checkpointed run does)
    watch_fixed_s: float = 0.0
    #: what the blocks' first checkpoints were charged (stall, writer): taken whatever they cost
    first_stall_s: float = 0.0
    first_background_s: float = 0.0
    first_waited_s: float = 0.0
    estimate: dict[str, float] = field(default_factory=dict)
    background: dict[str, float] = field(default_factory=dict)
    held: dict[str, float] = field(default_factory=dict)  # per block: the GIL time its last checkpoint was charged
    checkpointed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    for_replay: list[int] = field(default_factory=list)  # of them, those kept past the budget: they pay back
    seen: set[str] = field(default_factory=set)  # blocks checkpointed at least once (the first: not in estimate)

    def due(self, block: str, epoch: int | None, *, elapsed: float, run_s: float | None = None) -> bool:
        """Whether to checkpoint ``block`` at ``epoch``, ``elapsed`` seconds into training;
        ``run_s``: the block's last run (what a replay re-executes without this checkpoint)."""
        if epoch is None:
            return True  # blocks outside the loop run once: always memoize them
        ok, past = self._ok(block, epoch, elapsed, run_s)
        if ok and past and (not self.for_replay or self.for_replay[-1] != epoch):
            self.for_replay.append(epoch)
        if not ok:
            self.refused(epoch)
        return ok

    def may_be_due(self, blocks: Iterable[str], epoch: int, *, elapsed: float,
                   run_s: Mapping[str, float] | None = None) -> bool:
        """Whether some block of ``blocks`` (those of the epoch before; ``run_s``: their last runs),
        or one never measured, may be checkpointed at ``epoch`` (True where none ran: a new one may
        come). Asked at the end of the epoch before, it decides whether the recording notes the
        loop's variables a replay worker starting at ``epoch`` needs (``flor.engine.record``); a
        block of ``epoch`` is checkpointed only where they were.

        >>> p = CheckpointPolicy(every=3)
        >>> [e for e in range(1, 8) if p.may_be_due(["train"], e, elapsed=1.0)]
        [3, 6]
        >>> p = CheckpointPolicy(overhead=0.01); p.observe("train", 0, stall=0.5)
        >>> p.may_be_due(["train"], 1, elapsed=20.0), p.may_be_due(["train", "eval"], 1, elapsed=20.0)
        (False, True)
        >>> p.may_be_due(["train"], 1, elapsed=40.0), p.may_be_due(["train"], 1, elapsed=40.0, run_s={"train": 20.0})
        (False, True)
        >>> p.skipped, p.for_replay  # asking decides nothing (True: past the budget, it pays a replay back)
        ([], [])
        >>> p = CheckpointPolicy(overhead=0.01); p.observe("train", 0, stall=0.5, first=True)  # not measured
        >>> p.may_be_due(["train"], 1, elapsed=20.0), p.may_be_due(["train"], 1, elapsed=60.0)  # as due() asks
        (False, True)
        """
        if self.every is not None:
            return epoch % self.every == 0
        names = set(blocks)
        if not names or not names <= self.seen:
            return True  # a block never checkpointed: its first checkpoint is taken whatever it costs
        run_s = run_s or {}
        for block in names:  # asked at the end of every epoch: a loop, not a generator
            if self._ok(block, epoch, elapsed, run_s.get(block))[0]:
                return True
        return False

    def refused(self, epoch: int) -> None:
        """``epoch`` is not checkpointed (for the exit line's count), though ``due`` may have said so."""
        if self.for_replay and self.for_replay[-1] == epoch:
            self.for_replay.pop()
        if not self.skipped or self.skipped[-1] != epoch:
            self.skipped.append(epoch)

    def _ok(self, block: str, epoch: int, elapsed: float, run_s: float | None) -> tuple[bool, bool]:
        """Whether ``block`` is due at ``epoch``, and whether only because it pays back a replay."""
        if self.every is not None:
            return epoch % self.every == 0, False
        expected = self.estimate.get(block, 0.0)  # none yet: measure (once within budget)
        expected += (self.background if self.shared else self.held).get(block, 0.0)
        # charged all the same, but a cost fewer checkpoints would not save does not decide: not the
        # probes every block run pays, nor the first checkpoints' one-time work (taken regardless)
        spent = self.charged_s - self.watch_fixed_s - self.first_charged_s
        if block not in self.estimate:  # its first checkpoint measures it, whatever the probes cost so far
            spent = self.charged_s - self.watch_s
        training = max(elapsed - spent, 0.0)
        if spent + expected <= self.overhead * training:
            return True, False
        if run_s is not None and block in self.estimate and self.pays_back(expected, run_s):
            return spent + expected <= CEILING * self.overhead * training, True
        return False, False

    @staticmethod
    def pays_back(cost: float, run_s: float) -> bool:
        """Whether a checkpoint that costs ``cost`` saves a replay ``PAYBACK`` times that: the
        block's run, less the restore (about what the writing cost).

        >>> CheckpointPolicy.pays_back(0.04, 1.0), CheckpointPolicy.pays_back(0.06, 1.0)
        (True, False)
        """
        return cost * PAYBACK <= run_s - cost

    def observe(self, block: str, epoch: int | None, *, stall: float, first: bool = False) -> None:
        """Account the measured stall of one checkpoint (``first``: the block's first)."""
        self.stall_s += stall
        self.seen.add(block)
        if first:
            self.first_stall_s += stall
        else:
            self.estimate[block] = stall
        if epoch is not None and (not self.checkpointed or self.checkpointed[-1] != epoch):
            self.checkpointed.append(epoch)

    def observe_background(self, block: str, seconds: float, held: float = 0.0, first: bool = False,
                           waited: float | None = None) -> float:
        """Account one checkpoint's background work (called from the writer): ``seconds``, the
        writer thread's CPU-seconds, charged while ``charge`` is ``CHARGE_SHARED``; ``held``,
        those outside the write system calls (holding the GIL), charged while ``CHARGE_IDLE``
        up to ``waited``, the seconds the training thread spent waiting (not for a core) while
        the writer worked (``flor.placement.OffCpu``; None where unknown: ``held``). Reported (run.json
        ``checkpoint_policy.background_share_s``, ``gil_s``, ``gil_waited_s``). Returns the GIL
        time charged (while ``CHARGE_IDLE``)."""
        charged = held if waited is None else min(held, waited)
        self.background_s += seconds
        self.held_s += held
        self.waited_s += charged
        if first:
            self.first_background_s += seconds
            self.first_waited_s += charged
        else:
            self.background[block] = seconds
            self.held[block] = charged
        return charged

    @property
    def first_charged_s(self) -> float:
        """What the blocks' first checkpoints were charged, as ``charged_s`` counts it now."""
        return self.first_stall_s + (self.first_background_s if self.shared else self.first_waited_s)

    @property
    def shared(self) -> bool:
        """Whether the background work takes cores from training (its CPU share is charged)."""
        return self.charge == CHARGE_SHARED

    def observe_watch(self, seconds: float, fixed: float = 0.0) -> None:
        """Account the probes' time so far (``flor.watch.Watch.seconds``: a running total), charged
        always: they run on the training thread. ``fixed``, of it, is what every block run pays
        whether or not it is checkpointed (``due`` leaves it out of the decision: skipping
        checkpoints would not save it).

        >>> p = CheckpointPolicy(overhead=0.01)
        >>> p.observe("train", 0, stall=0.001); p.observe("train", 1, stall=0.001)
        >>> p.observe_watch(0.05, fixed=0.05)  # probes every run pays: 5% of 1 s, over the budget alone
        >>> p.due("train", 2, elapsed=1.0), round(p.charged_s, 3)
        (True, 0.052)
        >>> p.observe_watch(0.05, fixed=0.0)  # noting only checkpointed runs do: fewer would save it
        >>> p.due("train", 3, elapsed=1.0)
        False
        """
        self.watch_s, self.watch_fixed_s = seconds, fixed

    @property
    def charged_s(self) -> float:
        """The cost charged to the budget so far, in seconds."""
        return self.stall_s + self.watch_s + (self.background_s if self.shared else self.waited_s)

    def summary(self, training_s: float, failed: frozenset = frozenset()) -> str:
        """The exit line: how many epochs were checkpointed, what that cost, and which rule
        charged the budget. Epochs in ``failed`` (taken, but their checkpoint was not written: it
        failed, or was abandoned by the exit flush)
        do not count as checkpointed.

        >>> p = CheckpointPolicy(overhead=0.01)
        >>> p.observe("train", 0, stall=0.01); _ = p.observe_background("train", 0.02)
        >>> line = p.summary(10.0)
        >>> line.split(" (")[0], "(--flor_overhead 1.0%, charged: stall + writer CPU (cores shared))" in line
        ('checkpointed 1 of 1 epochs for 0.30% of training time', True)
        >>> p.charge = CHARGE_IDLE; p.every = 2
        >>> p.summary(10.0, failed=frozenset({0})).split(" (")[:2]
        ['checkpointed 0 of 1 epochs for 0.10% of training time', "--flor_every 2, charged: stall + training's wait for the writer's GIL"]
        """  # noqa: E501 - a doctest's expected output is one line
        done = len([e for e in self.checkpointed if e not in failed])
        rule = f"--flor_every {self.every}" if self.every is not None else f"--flor_overhead {self.overhead:.1%}"
        if self.for_replay:
            rule += (f"; {len(self.for_replay)} past it, each saving a replay {PAYBACK}x its cost, "
                     f"up to {CEILING * self.overhead:.1%}")
        share = self.charged_s / max(training_s - self.charged_s, 1e-9)
        total = len(self.checkpointed) + len(self.skipped)
        return (f"checkpointed {done} of {total} epochs for {share:.2%} of training time "
                f"({rule}, charged: {self.charge})")

    def exit_line(self, training_s: float, failed: frozenset = frozenset()) -> str:
        """The recording's exit line (``summary``), FL121 where the policy left epochs out.

        >>> p = CheckpointPolicy(overhead=0.01); p.observe("train", 0, stall=0.01); p.skipped.append(1)
        >>> p.exit_line(10.0)[:50]
        'flor: FL121 checkpointed 1 of 2 epochs for 0.10% o'
        """
        if not self.skipped:
            return f"flor: {self.summary(training_s, failed)}"
        return (f"flor: FL121 {self.summary(training_s, failed)}; a replay re-executes the others from the nearest "
                "checkpoint")

    def per_run_note(self, run_s: float, runs: int, training_s: float) -> str | None:
        """FL122's text where the checks every block run pays (``run_s`` a run, over ``runs`` runs that
        took no checkpoint: the probes of the state outside ``end()``, never thinned) cost more than
        the budget by themselves, over at least ``PER_RUN_MIN`` runs; None otherwise. A block per
        iteration of a small model: the budget thins checkpoints, not these, so it cannot keep the
        overhead within ``--flor_overhead``. flor's own bookkeeping a run is not timed (that would
        cost as much again), so the share said is a lower bound.

        >>> p = CheckpointPolicy(overhead=0.01)
        >>> p.per_run_note(6e-6, 60000, 15.0)[:62]
        'FL122 the checks flor makes at every block run cost at least 2'
        >>> p.per_run_note(2e-6, 60000, 15.0), p.per_run_note(6e-6, 500, 15.0)
        (None, None)
        """
        steady_s = run_s * runs
        if runs < PER_RUN_MIN or training_s <= 0 or steady_s <= self.overhead * training_s:
            return None
        return (f"FL122 the checks flor makes at every block run cost at least {steady_s / training_s:.1%} of training "
                f"by themselves ({runs} runs, one every {training_s / runs * 1e3:.2f} ms): more than the "
                f"{self.overhead:.1%} overhead budget, which thins checkpoints, not these; make one block run cover "
                "several iterations (docs/loops.md#iteration-loops-nanogpt)")

    def describe(self) -> dict:
        return {
            "mode": "every" if self.every is not None else "adaptive", "every": self.every,
            "overhead_budget": self.overhead, "charged": self.charge, "charged_s": round(self.charged_s, 6),
            "stall_s": round(self.stall_s, 6), "watch_s": round(self.watch_s, 6),
            "watch_fixed_s": round(self.watch_fixed_s, 6), "first_charged_s": round(self.first_charged_s, 6),
            "background_share_s": round(self.background_s, 6), "gil_s": round(self.held_s, 6),
            "gil_waited_s": round(self.waited_s, 6),
            "checkpointed_epochs": self.checkpointed, "skipped_epochs": self.skipped,
            "replay_epochs": self.for_replay, "payback": PAYBACK, "ceiling": round(CEILING * self.overhead, 6),
        }
