"""Any epoch's checkpoint in a notebook, without a replay: ``flor.load`` and ``flor.checkpoints``.

``load`` reads a checkpoint the way a replay does (``Restorer.load``: the manifest's digest and
every blob's hash checked) and restores it into live objects with the replay's trust rules (pickled
leaves only from a manifest signed with this user's key, or with ``trust_pickles=True``). The
global random generators are left alone unless ``rng=True``: a notebook evaluating a model does
not want its own randomness replaced.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from ..errors import CheckpointError, StateError
from ..settings import SETTINGS, Settings
from ..state.describe import arity_message
from ..store import ExperimentStore
from ..store.experiment import open_experiment
from .restorer import Restorer
from .session import as_result

__all__ = ["Checkpoint", "checkpoints", "load"]


class Checkpoint(NamedTuple):
    """One committed checkpoint: the state ``end()`` was given by ``block`` at ``epoch`` of ``run``
    (``epoch`` None: a block outside ``flor.it``'s loop; ``occurrence``: its n-th run in that epoch)."""

    run: str
    block: str
    epoch: int | None
    occurrence: int


def checkpoints(name: str | None = None, *, run: str | Sequence[str] | None = None,
                home: Path | None = None) -> list[Checkpoint]:
    """The checkpoints of one run (default the latest; ``run="all"``: every run), in epoch order.

    >>> checkpoints("no-such-experiment", home=Path("/nonexistent"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    flor.errors.ReplayError: ...
    """
    store = open_experiment(name, home)
    out: list[Checkpoint] = []
    for r in store.select_runs(run):
        found = [Checkpoint(r, block, epoch, occ) for block, epoch, occ in store.manifests(r)]
        out.extend(sorted(found, key=lambda c: (-1 if c.epoch is None else c.epoch, c.block, c.occurrence)))
    return out


def load(name: str | None, epoch: int | None, *, into: Sequence[Any], block: str | None = None,
         run: str | None = None, occurrence: int = 0, rng: bool = False, trust_pickles: bool = False,
         home: Path | None = None) -> Any:
    """Restore into ``into`` (the objects, in the order ``end()`` was given them) the state they had
    at the end of ``block`` at ``epoch``; returns them as ``end()`` does (a single object alone, else
    a tuple; immutable values such as a step counter come back as new values). An entry of ``into``
    may be None to leave that object out.

    ``block`` may be left out when the epoch has one; ``run`` defaults to the latest recording.
    """
    store = open_experiment(name, home)
    run_id = store.select_runs(run)[0]
    meta = store.read_run(run_id)
    block = _block(store, run_id, epoch, block, occurrence)
    settings: Settings = replace(SETTINGS, mode="inert", home=store.root.parent,
                                 trust_pickles=trust_pickles or SETTINGS.trust_pickles)
    restorer = Restorer(store, run_id, meta, settings, lambda code, text: None)
    manifest, cache = restorer.load((block, epoch, occurrence))
    recorded = list((manifest.get("objects") or {}).get("v") or [])
    objs = tuple(into)
    if len(recorded) != len(objs):
        raise StateError(arity_message(block, epoch, recorded, objs) + " (flor.load's into=)")
    if rng and None not in objs:
        return as_result(restorer.restore(manifest, cache, objs))  # as a replay restores it, generators last
    from ..state import restore

    trust = restorer.pickle_trust(manifest)
    out = tuple(live if live is None and isinstance(node, dict) and node.get("t") == "stateful"
                else restore(live, node, cache.__getitem__, f"[{i}]", pickles=trust)
                for i, (live, node) in enumerate(zip(objs, recorded)))
    if rng:
        from ..state import decode, restore_rng

        restore_rng(decode(manifest["rng"], cache.__getitem__, path="rng", pickles=trust))
    return as_result(out)


def _block(store: ExperimentStore, run: str, epoch: int | None, block: str | None, occurrence: int) -> str:
    """The block to load, checked: a CheckpointError names what exists instead."""
    here = sorted({b for b, e, o in store.manifests(run) if e == epoch and o == occurrence})
    if block is not None:
        store.check_block_name(block)
        if block in here:
            return block
        epochs = sorted({e for b, e, _ in store.manifests(run) if b == block and e is not None})
        if not epochs:
            known = sorted({b for b, _, _ in store.manifests(run)}) or ["none"]
            raise CheckpointError(f"run {run} has no checkpoint of block {block!r}; its blocks are "
                                  f"{', '.join(known)}")
        where = "outside the loop" if epoch is None else f"at epoch {epoch}"
        raise CheckpointError(f"run {run} has no checkpoint of block {block!r} {where} (occurrence {occurrence}); "
                              f"it has epochs {_ranges(epochs)}: load one of them, or replay to reach {where}")
    if len(here) == 1:
        return here[0]
    where = "outside the loop" if epoch is None else f"at epoch {epoch}"
    if not here:
        epochs = sorted({e for _, e, _ in store.manifests(run) if e is not None})
        raise CheckpointError(f"run {run} has no checkpoint {where}; it has epochs {_ranges(epochs) or 'none'} "
                              "(flor.checkpoints lists them): load one of them, or replay to reach it")
    raise CheckpointError(f"run {run} has checkpoints of blocks {', '.join(here)} {where}: name one with block=")


def _ranges(epochs: list[int]) -> str:
    """``0, 2, 4`` (up to 12 of them, then how many more)."""
    from .._fmt import listed

    return listed([str(e) for e in epochs], 12)
