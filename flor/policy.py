"""Which epochs to checkpoint: every one while that fits the overhead budget, fewer when not.

Pure bookkeeping over measured times; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CheckpointPolicy"]


@dataclass
class CheckpointPolicy:
    """Keep the training thread's checkpoint stall within ``overhead`` of training time.

    The stall of each block's last checkpoint is the estimate for its next one, and is
    measured again every time (model size, disk speed and contention change during a run).
    An epoch is checkpointed when the stall so far plus that estimate stays within budget;
    so an expensive checkpoint thins out the following ones into a regular period. With
    ``every`` set, the schedule is fixed instead: epochs 0, N, 2N, ...

    >>> p = CheckpointPolicy(overhead=0.01)
    >>> p.due("train", 0, elapsed=10.0)   # nothing measured yet: measure
    True
    >>> p.observe("train", 0, stall=0.5)  # 5% of the 10 s so far
    >>> p.due("train", 1, elapsed=20.0), p.due("train", 9, elapsed=110.0)
    (False, True)
    """

    overhead: float = 0.01
    every: int | None = None
    stall_s: float = 0.0
    background_s: float = 0.0
    estimate: dict[str, float] = field(default_factory=dict)
    background: dict[str, float] = field(default_factory=dict)
    checkpointed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)

    def due(self, block: str, epoch: int | None, *, elapsed: float) -> bool:
        """Whether to checkpoint ``block`` at ``epoch``, ``elapsed`` seconds into training."""
        if epoch is None:
            return True  # blocks outside the loop run once: always memoize them
        if self.every is not None:
            ok = epoch % self.every == 0
        else:
            expected = self.estimate.get(block)
            ok = expected is None or self.stall_s + expected <= self.overhead * max(elapsed - self.stall_s, 0.0)
        if not ok and (not self.skipped or self.skipped[-1] != epoch):
            self.skipped.append(epoch)
        return ok

    def observe(self, block: str, epoch: int | None, *, stall: float) -> None:
        """Account the measured stall of one checkpoint."""
        self.stall_s += stall
        self.estimate[block] = stall
        if epoch is not None and (not self.checkpointed or self.checkpointed[-1] != epoch):
            self.checkpointed.append(epoch)

    def observe_background(self, block: str, seconds: float) -> None:
        """Account the share of the machine one checkpoint's background work took.

        Where training runs on the CPU, the background thread's hashing and writing take
        cores from training: the recorder reports that CPU time divided by the cores. It is
        reported beside the stall (run.json ``checkpoint_policy.background_share_s``), not
        charged to the budget, which is about the training thread's stall; the writer thread
        runs a few nice levels below training, so it yields to training without being starved
        by it or by other work (flor.store.writer). (Called from the writer.)
        """
        self.background_s += seconds
        self.background[block] = seconds

    def describe(self) -> dict:
        return {
            "mode": "every" if self.every is not None else "adaptive", "every": self.every,
            "overhead_budget": self.overhead, "stall_s": round(self.stall_s, 6),
            "background_share_s": round(self.background_s, 6),
            "checkpointed_epochs": self.checkpointed, "skipped_epochs": self.skipped,
        }
