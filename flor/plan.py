"""The replay plan: which epochs a worker replays, and which it runs first to rebuild state.

Pure functions over epoch numbers; no torch, no files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["ReplayPlan", "block_action", "init_start", "make_plan", "segment"]


def segment(epochs: int, pid: int, ngpus: int) -> range:
    """The PID-th of NGPUS contiguous segments of ``range(epochs)``; sizes differ by at most one.

    >>> [list(segment(5, p, 2)) for p in range(2)]
    [[0, 1], [2, 3, 4]]
    """
    if epochs < 0 or ngpus < 1 or not 0 <= pid < ngpus:
        raise ValueError(f"no segment {pid}/{ngpus} of {epochs} epochs")
    return range(pid * epochs // ngpus, (pid + 1) * epochs // ngpus)


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


def make_plan(
    epochs: int, pid: int, ngpus: int, restorable: Iterable[int], *, strong: bool = False
) -> ReplayPlan:
    """Plan worker ``pid`` of ``ngpus`` over ``epochs`` epochs.

    ``restorable`` holds the epochs whose every block has a checkpoint.

    >>> p = make_plan(10, 1, 2, restorable={0, 2, 4, 6, 8})
    >>> (list(p.init), list(p.segment))
    ([4], [5, 6, 7, 8, 9])
    """
    seg = segment(epochs, pid, ngpus)
    if len(seg) == 0:
        return ReplayPlan(epochs, pid, ngpus, seg, range(seg.start, seg.start))
    start = init_start(seg.start, restorable, strong=strong)
    return ReplayPlan(epochs, pid, ngpus, seg, range(start, seg.start))


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
