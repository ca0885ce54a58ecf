"""A replay's checkpoints: which are sound, fetching and prefetching their blobs, restoring the
objects given to ``end()``, verifying a re-executed block against its recorded state, and the
random state around blocks (``Restorer``, a part ``flor.engine.replay.ReplaySession`` owns)."""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import CheckpointError, FlorError, ReplayError, StateError
from ..plan import ReplayPlan, block_action
from ..settings import Settings
from ..store import ExperimentStore
from ..store.experiment import blob_hashes
from ..store.runmeta import RunMeta
from ..verify import CAUSE_CODE, CAUSE_NONDET, CAUSE_NOT_PASSED, CAUSE_RNG, BlockEvent, cause_missing

__all__ = ["Restorer"]


class Restorer:
    """The checkpoints of the run a replay follows, and what it knows of the live state:
    ``anchored`` (exact: no epoch skipped since the start), ``from_restore`` (last set from a
    checkpoint), ``rng_exact`` (the global random state is the recording's as of the last block's
    end). ``note(code, text)`` says a finding once."""

    def __init__(self, store: ExperimentStore, run: str, meta: RunMeta, settings: Settings,
                 note: Callable[[str, str], None]) -> None:
        self.store, self.run, self.meta, self.settings, self.note = store, run, meta, settings, note
        self.available = set(store.manifests(run))
        self.plan: ReplayPlan | None = None
        self.code_changed = False  # the script changed by more than logging: the likely cause of a divergence
        self.missing: list[str] = []  # state this replay knows it did not restore: a likelier cause
        self.anchored = True
        self.from_restore = False
        self.rng_exact = False
        self.io = {"load_s": 0.0, "restore_s": 0.0, "restore_bytes": 0}  # for the benchmarks
        self.carried: dict[str, Any] = {}  # of the last restore: the values its block carries (flor.watch.carried)
        self._sound: set[tuple] = set()  # manifests read and found intact (``drop_damaged``)
        self._prefetched: dict[tuple, Any] = {}
        self._reader: Any = None
        self._rng_noted = False
        self._outside_noted = False  # a note said code outside the blocks drew random numbers

    def check_recorded(self, name: str, epoch: int | None, occ: int) -> None:
        """A ReplayError when the script's block ``name`` (its ``occ``-th at ``epoch``) is not one the
        recording ran there: the script's blocks no longer match."""
        recorded: list[list] | None
        if epoch is None:
            recorded = self.meta.outside_blocks
            finished = self.meta.status == "finished"
        else:
            recorded = self.meta.epoch_blocks.get(str(epoch))
            finished = recorded is not None
        if finished and recorded is not None and [name, occ] not in recorded:
            where = "outside the loop" if epoch is None else f"at epoch {epoch}"
            names = sorted({n for n, _ in recorded}) or "none"
            raise ReplayError(
                f"SkipBlock {name!r} (occurrence {occ}) {where} is not in the recording {self.run}, whose "
                f"blocks there were {names}: the script's blocks no longer match; rename the block back "
                f"or record again with --flor {self.settings.name}"
            )

    def restorable(self, epoch: int) -> bool:
        blocks = self.meta.epoch_blocks.get(str(epoch))
        if not blocks:
            return False
        return all((name, epoch, occ) in self.available for name, occ in blocks)

    def drop_damaged(self, epochs: range) -> bool:
        """Read the manifests of ``epochs`` before the plan relies on them; a damaged one (its
        checksum, structure or file name wrong) leaves ``available`` with one note naming the
        file, so the plan re-executes it from the nearest earlier checkpoint; so does one without
        the gradients of a block that adds to those of its previous run (``flor.state.grads``):
        restored, the next run would start from other gradients. True when one did."""
        dropped = False
        for epoch in epochs:
            for name, occ in self.meta.epoch_blocks.get(str(epoch), []):
                key = (name, epoch, occ)
                if key not in self.available or key in self._sound:
                    continue
                try:
                    manifest = self.store.read_manifest(self.run, *key)
                except FlorError as exc:
                    if self.settings.strict:
                        raise CheckpointError(f"{exc} (--flor_strict: a replay does not go on without it)") from exc
                    self.available.discard(key)
                    self.note("FL315", f"{exc}; replay re-executes that epoch from the nearest earlier checkpoint")
                    dropped = True
                else:
                    if name in self.meta.grads_carried and "grads" not in manifest:
                        self.available.discard(key)
                        self.note("FL316", f"block {name!r} adds to the gradients its previous run left (run.json: "
                                  f"grads_carried) and its checkpoint at epoch {epoch} holds none (taken before flor "
                                  "noticed, or its gradients could not be stored): replay re-executes that epoch "
                                  "from the nearest earlier checkpoint")
                        dropped = True
                        continue
                    self._sound.add(key)
        return dropped

    def pickle_trust(self, manifest: dict) -> Any:
        """May this manifest's pickled leaves be loaded? Only when it is signed with this user's
        key, or with --flor_trust_pickles (flor.store.trust)."""
        from ..state import PickleTrust
        from ..store import trust
        from ..store.manifest import canonical_bytes, has_pickles

        key = str(trust.key_file(self.settings.config_dir))
        if self.settings.trust_pickles:
            return PickleTrust(True, key_file=key)
        if not has_pickles(manifest):
            return PickleTrust(False, key_file=key)
        why = trust.verify(manifest.get("hmac"), canonical_bytes(manifest), self.settings.config_dir)
        return PickleTrust(why is None, why or "", key)

    def start_like_recording(self, manifest: dict, name: str, epoch: int | None) -> None:
        """Give a re-executed block the global RNG state its recorded run started from.

        They differ only where the process seeded a generator itself (Python's and NumPy's
        are seeded from the OS when a script does not seed them): the block's own draws then
        match the recording, and its end state can be checked against it.
        """
        from ..state import restore_rng

        if "rng_start" not in manifest:
            return
        differs = self._rng_start_differs(manifest)
        if differs:
            restore_rng(self._recorded_rng(manifest, "rng_start"))
            differs = [g for g in differs if g in self._drawn_in(manifest)]  # one the block never drew from: moot
            if differs and not self._rng_noted:
                self._rng_noted = True
                self.note("FL324", f"the {', '.join(differs)} random state at the start of {name!r} (epoch {epoch}) "
                          "differed from the recording (is that generator seeded?); flor set it as recorded")

    @staticmethod
    def _drawn_in(manifest: dict) -> set[str]:
        """The global generators the recorded block drew from (its ``rng_start`` against its ``rng``):
        one it never drew from (NumPy's in a torch script, unseeded) makes no value differ."""
        from ..state import diff_nodes

        try:
            return {p.split(".")[0].split("[")[0] for p in diff_nodes(manifest["rng_start"], manifest["rng"])}
        except Exception:  # noqa: BLE001 - a tree of another shape: every generator counts
            return {"python", "numpy", "torch", "cuda"}

    def _rng_start_differs(self, manifest: dict) -> list[str]:
        """The global generators whose state now is not the one the block started from when recorded."""
        from ..state import capture_rng, diff_rng, snapshot

        captured = capture_rng()
        now = snapshot(captured, copy=False).materialize()
        return sorted({p.split(".")[0].split("[")[0]
                       for p in diff_rng(manifest["rng_start"], now, self._undrawn(manifest, "rng_start", captured))})

    def drawn_outside(self, manifest: dict, name: str, epoch: int | None) -> None:
        """Before a block this replay restores, with the random state exact at the last block's
        end: a generator that is not where the recording had it here was drawn from by code
        outside the blocks that the recording did not run (a hindsight line that samples).
        Restoring sets the recorded state, so what follows is the recording's training, not a
        full run of the edited script's: said once, as a note and in the verdict's cause."""
        if self._outside_noted or "rng_start" not in manifest:
            return
        differs = [g for g in self._rng_start_differs(manifest) if g in self._drawn_in(manifest)]
        if differs:
            self._outside_noted = True
            self.note("FL325", f"code outside the blocks drew from the {', '.join(differs)} random generator before "
                      f"{name!r} at epoch {epoch} where the recording did not (a hindsight line that samples?); "
                      "restoring the block set the recorded state, so later values are the recording's "
                      "training, not a full run of this script's; to leave training's randomness alone, "
                      "draw from a torch.Generator of your own in hindsight code")

    def _recorded_rng(self, manifest: dict, key: str) -> dict:
        """A checkpoint's recorded random state (``rng`` or ``rng_start``), decoded."""
        from ..state import decode

        cache = self.store.blobs.get_many(blob_hashes(manifest[key]))
        return decode(manifest[key], cache.__getitem__, path=key, pickles=self.pickle_trust(manifest))

    def _undrawn(self, manifest: dict, key: str, captured: dict) -> Callable[[int, int], bool]:
        """``diff_rng``'s check of the CUDA generators only one side has a device for: nothing
        drew from them, in the recording (its blobs are read only then) or in this process."""
        from ..state import cuda_undrawn

        def undrawn(recorded: int, now: int) -> bool:
            state = self._recorded_rng(manifest, key)
            return isinstance(state, dict) and cuda_undrawn(list(state.get("cuda", []))[now:]) \
                and cuda_undrawn(list(captured.get("cuda", []))[recorded:])

        return undrawn

    def load(self, key: tuple[str, int | None, int]) -> tuple[dict, dict[str, bytes]]:
        """A checkpoint's manifest and the verified bytes of every blob it names."""
        manifest = self.store.read_manifest(self.run, *key)
        return manifest, self.store.blobs.get_many(blob_hashes(manifest))

    def fetch(self, key: tuple[str, int | None, int]) -> tuple[dict, dict[str, bytes]]:
        future = self._prefetched.pop(key, None)
        return future.result() if future is not None else self.load(key)

    def prefetch_next(self, name: str, epoch: int | None, occ: int, probed: bool) -> None:
        """Read the next epoch's checkpoint of this block in the background while this
        epoch's outer-loop code runs (one epoch ahead: bounded memory)."""
        if epoch is None or self.plan is None or not self.plan.runs(epoch + 1):
            return
        key = (name, epoch + 1, occ)
        initializing = epoch + 1 < self.plan.segment.start
        if key not in self.available or key in self._prefetched or block_action(
                checkpointed=True, probed=probed, initializing=initializing) != "restore":
            return
        if self._reader is None:
            from concurrent.futures import ThreadPoolExecutor

            self._reader = ThreadPoolExecutor(1, thread_name_prefix="flor-prefetch")
        self._prefetched[key] = self._reader.submit(self.load, key)

    def restore(self, manifest: dict, cache: dict, objs: tuple) -> tuple:
        from ..state import restore_all
        from ..state.grads import restore_grads

        t0 = time.perf_counter()
        try:
            restored = restore_all(list(objs), manifest["objects"], manifest["rng"], cache.__getitem__,
                                   pickles=self.pickle_trust(manifest))
        except StateError as exc:
            first = self.plan.first if self.plan is not None else 0
            if first == 0:
                raise
            # the loop code of the epochs before this worker's did not run here: a head grown or an
            # optimizer re-created at one of them is not in the objects now
            raise StateError(f"{exc}; this worker starts at epoch {first} without running the loop's code of the "
                             "epochs before it: if that code changes what the block uses (a layer replaced, an "
                             "optimizer re-created at some epoch), replay with --flor_strong") from exc
        if "grads" in manifest:  # the block adds to them in its next run (flor.state.grads)
            restore_grads(restored, manifest["grads"], cache.__getitem__)
        self.carried = {}  # the values its next run reads first (flor.watch.carried), set by the probe
        if "carried" in manifest:
            from ..state.decode import decode

            found = decode(manifest["carried"], cache.__getitem__, to_device=True, path="carried")
            self.carried = found if isinstance(found, dict) else {}
        self.io["restore_s"] += time.perf_counter() - t0
        self.anchored = self.from_restore = self.rng_exact = True
        return tuple(restored)

    def verify(self, manifest: dict, objs: tuple, event: BlockEvent) -> tuple[tuple, BlockEvent]:
        from ..state import capture_rng, diff_nodes, diff_rng, snapshot

        now_objs = snapshot(list(objs), copy=False).materialize()
        captured = capture_rng()
        now_rng = snapshot(captured, copy=False).materialize()
        diffs = [self._label(p, manifest) for p in diff_nodes(manifest["objects"], now_objs)]
        rng_diffs = sorted({f"{p.split('.')[0].split('[')[0]} random state"
                            for p in diff_rng(manifest["rng"], now_rng, self._undrawn(manifest, "rng", captured))})
        if not diffs and not rng_diffs:
            event.action = "matched"
            self.from_restore = False
            self.rng_exact = True
            return objs, event
        event.action, event.tensors = "diverged", diffs + rng_diffs
        if self.missing:  # state flor knows it did not restore: named before the edit is blamed
            event.cause = cause_missing(self.missing)
        elif self.code_changed:
            event.cause = CAUSE_CODE
        elif not diffs:
            event.cause = CAUSE_RNG
        elif self.from_restore:
            event.cause = CAUSE_NOT_PASSED
        else:
            event.cause = CAUSE_NONDET
        cache = self.store.blobs.get_many(blob_hashes(manifest))
        return self.restore(manifest, cache, objs), event  # go on from the recorded state

    def diverged(self, event: BlockEvent, names: list[str]) -> BlockEvent:
        """A re-executed block whose variables outside ``end()`` (``names``: ``variable x``) differ from
        what the recording's run noted: diverged like its objects (they are left as re-executed)."""
        if event.action != "diverged":
            event.action, event.tensors = "diverged", []
            event.cause = cause_missing(self.missing) if self.missing else CAUSE_CODE if self.code_changed \
                else CAUSE_NONDET
        event.tensors = list(event.tensors) + names
        return event

    @staticmethod
    def _label(path: str, manifest: dict) -> str:
        if not path.startswith("["):
            return path
        index, _, rest = path[1:].partition("]")
        try:
            node = manifest["objects"]["v"][int(index)]
            cls: Any = node.get("cls", node.get("t", "")) if isinstance(node, dict) else type(node).__name__
        except (ValueError, IndexError, KeyError, TypeError):
            return path
        return f"end() argument {index} ({cls.rsplit('.', 1)[-1]}){rest}"


def with_spool(store: ExperimentStore, run: str, meta: RunMeta, settings: Settings, remote: Any) -> ExperimentStore:
    """The store a replay reads, its blobs falling back on a spool: ``remote`` (the spool the run
    was pulled from), else the one the run was recorded to or ``flor spool`` put it in, preferring
    one this user spooled to (flor.store.trust). What came from it is said at exit."""
    import atexit
    import os
    import sys

    from .._fmt import progress
    from ..store.journal import spooled_to
    from ..store.sync import LazyRemote
    from ..store.trust import spool_trusted

    spools = [] if remote is not None else [meta.spool] if meta.spool else spooled_to(store.root, run)
    if spools:
        own = [url for url in spools if spool_trusted(settings.config_dir, url)]
        remote = LazyRemote(store, (own or spools)[0], progress=progress, trusted=bool(own),
                            say=lambda text: print(f"flor: {text}", file=sys.stderr))
    if remote is None:
        return store
    owner = os.getpid()  # not in a child made by os.fork
    atexit.register(lambda: os.getpid() == owner and remote.summary() and print(f"flor: {remote.summary()}",
                                                                               file=sys.stderr))
    return ExperimentStore(settings.home, store.name, remote=remote)
