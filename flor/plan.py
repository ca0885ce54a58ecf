"""The replay plan: which epochs a worker replays, and which it runs first to rebuild state;
and what a replay will cost, from the recording's timings.

Pure functions over epoch numbers and seconds; no torch, no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Mapping, Sequence

__all__ = [
    "BlockCost", "EpochCost", "ReplayPlan", "block_action", "epoch_seconds", "estimate", "fastest",
    "init_start", "make_plan", "restorable_epochs", "segment", "select", "worker_seconds",
]


#: more workers only where estimated this much faster than fewer (``fastest``)
FASTER_BY = 0.15


def select(epochs: int, epoch_range: tuple[int, int | None] | None) -> range:
    """The epochs a replay covers: every one, or ``epoch_range`` (a slice) clipped to ``epochs``.

    >>> select(10, None), select(10, (4, 7)), select(10, (8, None)), select(10, (8, 50))
    (range(0, 10), range(4, 7), range(8, 10), range(8, 10))
    """
    if epoch_range is None:
        return range(epochs)
    start, stop = epoch_range
    stop = epochs if stop is None else min(stop, epochs)
    return range(min(start, epochs), max(min(start, epochs), stop))


def segment(epochs: int, pid: int, ngpus: int, within: range | None = None) -> range:
    """The PID-th of NGPUS contiguous segments of ``within`` (default ``range(epochs)``);
    sizes differ by at most one.

    >>> [list(segment(5, p, 2)) for p in range(2)]
    [[0, 1], [2, 3, 4]]
    >>> [list(segment(10, p, 2, within=range(4, 7))) for p in range(2)]
    [[4], [5, 6]]
    """
    if epochs < 0 or ngpus < 1 or not 0 <= pid < ngpus:
        raise ValueError(f"no segment {pid}/{ngpus} of {epochs} epochs")
    base = range(epochs) if within is None else within
    n = len(base)
    return range(base.start + pid * n // ngpus, base.start + (pid + 1) * n // ngpus)


def restorable_epochs(epoch_blocks: Mapping[str, Sequence[Sequence]], available: Collection[tuple]) -> set[int]:
    """Epochs whose every recorded block has a checkpoint.

    ``epoch_blocks`` is run.json's ``{"epoch": [[block, occurrence], ...]}``; ``available``
    holds the ``(block, epoch, occurrence)`` of the committed checkpoints.

    >>> sorted(restorable_epochs({"0": [["b", 0]], "1": [["b", 0]], "2": []}, {("b", 0, 0)}))
    [0]
    """
    return {int(e) for e, blocks in epoch_blocks.items()
            if blocks and all((name, int(e), occ) in available for name, occ in blocks)}


def init_start(first: int, restorable: Iterable[int], *, strong: bool = False) -> int:
    """The epoch a worker whose segment starts at ``first`` begins running from.

    That is the newest epoch before ``first`` whose blocks were all checkpointed (its state
    is restored there and rebuilt forward), or 0 when there is none or ``strong`` is set.
    """
    if first <= 0 or strong:
        return 0
    earlier = [e for e in restorable if e < first]
    return max(earlier) if earlier else 0


@dataclass(frozen=True)
class ReplayPlan:
    """What one replay worker runs: ``init`` epochs (logs muted), then its ``segment``."""

    epochs: int
    pid: int
    ngpus: int
    segment: range
    init: range
    within: range | None = None  # the epoch selection, None: every epoch

    @property
    def first(self) -> int:
        """The first epoch this worker iterates over (initialization included)."""
        return self.init.start if len(self.init) else self.segment.start

    @property
    def stop(self) -> int:
        """One past the last epoch this worker iterates over."""
        return self.segment.stop if len(self.segment) else self.first

    def runs(self, epoch: int) -> bool:
        return self.first <= epoch < self.stop

    def reports(self, epoch: int | None) -> bool:
        """Whether values logged at ``epoch`` belong to this worker's output.

        Values logged outside the epoch loop (``epoch is None``) are reported by worker 0
        only before the loop and by the last worker only after it; see ``Session``.
        """
        return epoch is not None and epoch in self.segment

    @property
    def reports_after(self) -> bool:
        """Whether this worker reports values logged after the loop: the last worker, and only
        when the selection reaches the last epoch (only then is the state after the loop exact)."""
        return self.pid == self.ngpus - 1 and (self.within is None or self.within.stop >= self.epochs)


def make_plan(
    epochs: int, pid: int, ngpus: int, restorable: Iterable[int], *, strong: bool = False,
    within: range | None = None,
) -> ReplayPlan:
    """Plan worker ``pid`` of ``ngpus`` over ``epochs`` epochs (or over the selection ``within``).

    ``restorable`` holds the epochs whose every block has a checkpoint.

    >>> p = make_plan(10, 1, 2, restorable={0, 2, 4, 6, 8})
    >>> (list(p.init), list(p.segment))
    ([4], [5, 6, 7, 8, 9])
    >>> p = make_plan(10, 0, 2, restorable={0, 2, 4, 6, 8}, within=range(5, 9))
    >>> (list(p.init), list(p.segment))
    ([4], [5, 6])
    """
    seg = segment(epochs, pid, ngpus, within)
    if len(seg) == 0:
        return ReplayPlan(epochs, pid, ngpus, seg, range(seg.start, seg.start), within)
    start = init_start(seg.start, restorable, strong=strong)
    return ReplayPlan(epochs, pid, ngpus, seg, range(start, seg.start), within)


def block_action(*, checkpointed: bool, probed: bool, initializing: bool) -> str:
    """``"restore"`` or ``"execute"`` for one block of one epoch.

    A block runs when the user probes it (except while rebuilding state, where its result is
    not reported) or when there is no checkpoint to restore.
    """
    if not checkpointed:
        return "execute"
    if probed and not initializing:
        return "execute"
    return "restore"


# -- what a replay costs ---------------------------------------------------------------


@dataclass(frozen=True)
class BlockCost:
    """One block of one recorded epoch: seconds to run it, to restore (or verify) its checkpoint."""

    name: str
    run_s: float
    restore_s: float
    checkpointed: bool


@dataclass(frozen=True)
class EpochCost:
    """One recorded epoch: the outer-loop seconds (everything but the blocks) and its blocks."""

    outer_s: float
    blocks: tuple[BlockCost, ...] = ()


def epoch_seconds(cost: EpochCost, *, probed: Collection[str] | bool, initializing: bool) -> float:
    """Seconds a replay worker spends in one epoch, following ``block_action``.

    A restored block costs its restore; an executed one its run, plus a check against its
    checkpoint (about a restore's cost: the state is hashed) when it has one.

    >>> c = EpochCost(0.5, (BlockCost("train", 10.0, 0.25, True),))
    >>> epoch_seconds(c, probed=False, initializing=False), epoch_seconds(c, probed={"train"}, initializing=False)
    (0.75, 10.75)
    """
    total = cost.outer_s
    for b in cost.blocks:
        is_probed = probed if isinstance(probed, bool) else b.name in probed
        action = block_action(checkpointed=b.checkpointed, probed=is_probed, initializing=initializing)
        if action == "restore":
            total += b.restore_s
        else:
            total += b.run_s + (b.restore_s if b.checkpointed else 0.0)
    return total


def worker_seconds(plan: ReplayPlan, costs: Sequence[EpochCost], *, startup_s: float,
                   probed: Collection[str] | bool) -> float:
    """Seconds one worker takes: its startup, its initialization epochs, then its segment.

    The epochs before ``plan.first`` cost nothing: the loop skips them without running them.
    """
    if len(plan.segment) == 0:
        return startup_s
    t = startup_s
    for e in plan.init:
        t += epoch_seconds(costs[e], probed=probed, initializing=True)
    for e in plan.segment:
        t += epoch_seconds(costs[e], probed=probed, initializing=False)
    return t


def estimate(costs: Sequence[EpochCost], workers: int, restorable: Iterable[int], *, startup_s: float,
             probed: Collection[str] | bool = False, strong: bool = False, within: range | None = None,
             slowdown: float = 1.0, startup_slowdown: float | None = None) -> list[float]:
    """Seconds each of ``workers`` workers takes; the replay takes the largest.

    ``slowdown`` (at least 1) stretches every worker's epochs when workers share cores or GPUs;
    ``startup_slowdown`` its start-up (default: ``slowdown``), which runs one thread a worker
    (the interpreter, imports, the script up to its loop) whatever torch's thread count.

    >>> costs = [EpochCost(0.0, (BlockCost("train", 1.0, 0.0, True),))] * 4
    >>> estimate(costs, 2, {0, 1, 2, 3}, startup_s=1.0, probed=True)
    [3.0, 3.0]
    >>> estimate(costs, 2, {0, 1, 2, 3}, startup_s=1.0, probed=True, slowdown=2.0, startup_slowdown=1.0)
    [5.0, 5.0]
    """
    restorable = set(restorable)
    plans = [make_plan(len(costs), p, workers, restorable, strong=strong, within=within) for p in range(workers)]
    start = slowdown if startup_slowdown is None else startup_slowdown
    return [slowdown * (worker_seconds(pl, costs, startup_s=startup_s, probed=probed) - startup_s) + start * startup_s
            for pl in plans]


def fastest(costs: Sequence[EpochCost], restorable: Iterable[int], *, startup_s: float, max_workers: int,
            slowdown: Callable[[int], float] | None = None, probed: Collection[str] | bool = False,
            strong: bool = False, within: range | None = None,
            startup_slowdown: Callable[[int], float] | None = None) -> tuple[int, float]:
    """``(workers, seconds)`` of the worker count up to ``max_workers`` that finishes first;
    a count is taken over a smaller one only when estimated ``FASTER_BY`` faster, since every
    worker costs a process and the estimate errs (start-up under contention, a drifting
    machine): a replay without ``--workers`` is then not slower than one worker where the
    estimate is off by less than that.

    ``slowdown(n)`` is the stretch of the epochs with ``n`` workers (default: none),
    ``startup_slowdown(n)`` of their start-up (default: ``slowdown(n)``).
    """
    restorable = set(restorable)
    n_epochs = len(within) if within is not None else len(costs)
    best: tuple[int, float] | None = None
    for n in range(1, max(1, min(max_workers, max(n_epochs, 1))) + 1):
        t = max(estimate(costs, n, restorable, startup_s=startup_s, probed=probed, strong=strong, within=within,
                         slowdown=slowdown(n) if slowdown else 1.0,
                         startup_slowdown=startup_slowdown(n) if startup_slowdown else None))
        if best is None or t < best[1] * (1 - FASTER_BY):
            best = (n, t)
    assert best is not None
    return best
