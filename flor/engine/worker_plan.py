"""A replay worker's plan for the recorded epoch loop: which epochs it replays, which it runs
first to reach them, from which checkpoints (``flor.plan.make_plan``), checked against what the
recording ran and what its checkpoints still hold."""

from __future__ import annotations

from typing import Callable

from ..errors import ReplayError
from ..plan import ReplayPlan, make_plan, select
from ..settings import Settings
from ..store import ExperimentStore
from ..store.runmeta import RunMeta
from .ddp import check_replay_world
from .restorer import Restorer

__all__ = ["plan_loop"]


def plan_loop(length: int | None, *, meta: RunMeta, run: str, alive: bool, checkpoints: Restorer,
              store: ExperimentStore, settings: Settings, pid: int, ngpus: int,
              note: Callable[[str, str], None]) -> ReplayPlan:
    """The plan of worker ``pid`` of ``ngpus`` over a loop of ``length`` epochs (None: unknown)
    replaying ``run``; ``alive``: its recording is still running. Notes what limits it (FL311,
    FL312, FL313); a ReplayError where the loop or ``--flor_epochs`` cannot match the recording.
    Damaged checkpoints are dropped and the plan made again; the coming epochs' blobs are
    fetched ahead of need from a spool."""
    planned = meta.epochs_planned
    if length is not None and planned is not None and length != planned:
        raise ReplayError(
            f"the epoch loop now has {length} epochs but the recording {run} had {planned}: "
            "replay with the recorded arguments, or record again"
        )
    epochs = meta.epochs  # exactly the epochs the recording ran (RunMeta.epochs decides)
    if length is not None:
        epochs = min(epochs, length)
    if alive:
        note("FL311", f"the recording is still running: replaying the {epochs} epochs it has finished")
    elif meta.status == "running":
        note("FL311", f"the recording ended after {epochs} epochs (its process is gone); replaying those")
    elif meta.stopped_early or (planned is None and meta.status != "finished"):
        note("FL312", f"the recording ran {meta.epochs_text()} epochs; replaying epochs 0-{epochs - 1}"
             if epochs else f"the recording ran {meta.epochs_text()} epochs; there is nothing to replay")
    cp = checkpoints
    restorable = {e for e in range(epochs) if cp.restorable(e)}
    epoch_range = settings.epoch_range
    within = select(epochs, epoch_range) if epoch_range else None
    if epoch_range and within is not None and len(within) == 0:
        raise ReplayError(f"--flor_epochs {epoch_range[0]}:{epoch_range[1] or ''} "
                          f"selects no epoch of the recording's {epochs}: epochs are 0 to {epochs - 1}")
    plan = make_plan(epochs, pid, ngpus, restorable, strong=settings.strong, within=within)
    while cp.drop_damaged(range(plan.first, plan.stop)):  # what a damaged manifest held is not restorable
        restorable = {e for e in range(epochs) if cp.restorable(e)}
        plan = make_plan(epochs, pid, ngpus, restorable, strong=settings.strong, within=within)
    for text in check_replay_world(ngpus, meta, plan, restorable):
        note("FL313", text)
    if store.blobs.remote is not None:  # fetch the coming epochs' blobs from S3 ahead of need
        from ..store.sync import prefetch_plan

        prefetch_plan(store, run, meta, range(plan.first, plan.stop), cp.available)
    return plan

