"""Replay: follow the plan, restore or execute each block, verify, and report."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from .._files import read_bytes
from .._fmt import listed
from ..errors import CheckpointError, ConfigError, FlorError, ReplayError, StateError, StorageError
from ..logs import LogWriter, occurrence_keys, record_key, same_value
from ..store.layout import RunLayout
from ..store.runlogs import check_write_folders, read_run_logs, retire_worker_files
from ..logs.tensorboard import write_replay_events
from .ddp import check_replay_world, shared_replay_id
from ..plan import ReplayPlan, block_action, make_plan, select
from ..redact import redact_argv
from ..store.experiment import blob_hashes
from ..source.blocks import WRONG_MID_RUN, wrapper_advice
from ..state.describe import arity_message
from ..watch.attributes import restore_attrs
from ..watch.frames import caller_frame, left_normally
from ..watch.loop import LoopFrame, read_outer_state
from ..watch.names import block_site, stale_at_end, stale_note
from ..watch.outside import OutsideChanges
from ..watch.plain import decode
from ..watch.reachable import forgotten_in_replay
from ..watch.variables import read_block_state, restore_globals
from .session import Session, as_result
from ..placement import new_replay_id, pid_alive
from ..settings import Settings
from ..source.edits import non_logging_changes
from ..verify import CAUSE_CODE, CAUSE_NONDET, CAUSE_NOT_PASSED, CAUSE_RNG, BlockEvent, Summary, compare_logs

__all__ = ["ReplaySession"]


class ReplaySession(Session):
    mode = "replay"

    def __init__(self, settings: Settings) -> None:
        import torch

        super().__init__(settings)
        from .._fmt import progress
        from ..store import ExperimentStore
        from ..store.sync import LazyRemote, attach_spool
        from ..store.journal import spooled_to
        from ..store.trust import spool_trusted

        remote: Any = None
        if settings.spool:  # pull the run from the S3 spool when it is not local; blobs come on demand
            remote = attach_spool(self.store, settings.spool, settings.run, progress=progress)
        self.run, picked = self.store.replay_run(settings.run)
        try:
            self.meta = self.store.read_run(self.run)
        except StorageError as exc:
            if settings.run is not None:
                raise
            # not an older run in its place: the edited script was meant for the latest, and a
            # replay writes into the run it replays; the user picks the other run by name
            raise StorageError(f"the latest recording cannot be replayed: {exc}; to replay an earlier run, "
                               f"add --flor_run RUN (`flor ls {settings.name}` lists them)") from exc
        # evicted blobs come back from the spool the run was recorded to, or `flor spool` put it in
        spools = [] if remote is not None else \
            [self.meta.spool] if self.meta.spool else spooled_to(self.store.root, self.run)
        if spools:
            own = [url for url in spools if spool_trusted(settings.config_dir, url)]
            remote = LazyRemote(self.store, (own or spools)[0], progress=progress, trusted=bool(own),
                                say=lambda text: print(f"flor: {text}", file=sys.stderr))
        if remote is not None:  # a store whose blobs fall back on the spool; what came from it is said at exit
            self.store = ExperimentStore(settings.home, settings.name, remote=remote)
            owner = os.getpid()  # not in a child made by os.fork
            atexit.register(lambda: os.getpid() == owner and remote.summary()
                            and print(f"flor: {remote.summary()}", file=sys.stderr))
        self.run_dir = self.store.run_path(self.run)
        self.replay_id = settings.replay_id or shared_replay_id(settings) or new_replay_id()
        self.pid, self.ngpus = settings.pid, settings.ngpus
        self.plan: ReplayPlan | None = None
        self.initializing = False
        self.anchored = True  # the live state is exact (no epochs skipped since the start)
        self.from_restore = False  # ... and was last set from a checkpoint
        self.pending: tuple[str, dict | None, dict | None] | None = None
        self.available = set(self.store.manifests(self.run))
        self._sound: set[tuple] = set()  # manifests read and found intact (``_drop_damaged``)
        self.notes: list[str] = []
        self.forgotten_checked: set[str] = set()  # blocks whose end() was looked at for a scheduler left out
        self._block_vars: dict | None = None  # logs/block-state.jsonl, read at the first restore
        self._block_vars_noted: set[str] = set()  # blocks whose restored variables a note named
        self.outside = OutsideChanges()  # what code between a block's end() and its next step_into changed
        self.sites: dict[str, Any] = {}  # block -> where it is entered (flor.watch.names), until first restored
        if picked:
            self.note(picked)
        self.outer_restored: list[str] = []  # the loop's own variables this worker set as recorded
        self.io = {"load_s": 0.0, "restore_s": 0.0, "restore_bytes": 0}  # for the benchmarks
        self._prefetched: dict[tuple, Any] = {}
        self._rng_noted = False
        self._outside_noted = False  # a note said code outside the blocks drew random numbers
        self.rng_exact = False  # the global random state is the recording's as of the last block's end
        self._reader: Any = None
        self.code_changed = False
        self.layout = RunLayout(self.run_dir)
        check_write_folders(self.run_dir, self.store.root, self.replay_id)  # no link out of the store
        earlier = retire_worker_files(self.run_dir, self.replay_id, self.pid)  # a rerun starts clean
        self.logs = LogWriter(self.layout.replay_log(self.replay_id, self.pid))
        self.summary_path = self.layout.replay_summary(self.replay_id, self.pid)
        self.tee_output(self.layout.replay_output(self.replay_id, self.pid))

        status = self.meta.status
        self.recording_alive = status == "running" and bool(self.meta.pid) and pid_alive(int(self.meta.pid or 0))
        if status == "running" and not self.recording_alive:  # (a live one: noted with its epochs by loop_plan)
            self.note("the recording did not finish (its process is gone: killed or crashed); "
                      "epochs without checkpoints are re-executed")
        elif status not in ("running", "finished"):
            self.note(f"the recording ended as {status!r}; epochs without checkpoints are re-executed")
        recorded_threads = self.meta.threads  # range-checked: a damaged value never reaches torch
        if earlier is not None:
            self.note(f"worker {self.pid} of replay {self.replay_id} ran before; its earlier output is in {earlier}")
        if settings.threads is not None:  # asked for: faster with many workers on one machine, not bit-exact
            if settings.threads != recorded_threads:
                self.note(f"using {settings.threads} torch threads (--flor_threads), not the recorded "
                          f"{recorded_threads}: values may differ from the recording in the last bits")
            torch.set_num_threads(settings.threads)
        elif recorded_threads and torch.get_num_threads() != recorded_threads:
            self.note(f"using {recorded_threads} torch threads as recorded (this process had "
                      f"{torch.get_num_threads()}), so that results are bit-identical")
            torch.set_num_threads(int(recorded_threads))
        self._compare_script()
        self.summary = Summary(header="")
        self._install_hooks()

    def note(self, text: str) -> None:
        """Say ``text`` now, once; the summary file keeps it, the printed summary does not repeat it."""
        if text in self.notes:
            return
        self.notes.append(text)
        print(f"flor: {text}", file=sys.stderr)

    def _compare_script(self) -> None:
        recorded_path = self.meta.script
        current = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
        if recorded_path and current is not None and current.is_file():
            copy = self.run_dir / "source" / Path(recorded_path).name
            if copy.is_file():
                import hashlib

                data: bytes | None
                try:
                    data = read_bytes(copy)  # a regular file, capped, no link followed
                except OSError as exc:
                    self.note(f"the recording's copy of the script cannot be read ({exc.strerror or exc}); the "
                              "script's changes since the recording are not checked")
                    data = None
                if data is not None and self.meta.script_sha256 and \
                        hashlib.sha256(data).hexdigest() != self.meta.script_sha256:
                    self.note(f"the recording's copy of the script ({copy}) is not the script run.json names "
                              "(its sha256 differs: damaged, or cut short by a full disk); the script's changes "
                              "since the recording are not checked")
                    data = None
                old = data.decode("utf-8", "replace") if data is not None else None
                new = current.read_text(errors="replace")
                if old is not None and non_logging_changes(old, new):
                    self.code_changed = True
                    self.note("the script changed by more than logging since the recording "
                              f"(compare with {copy}); replayed values may differ from the recording")
        rec_args = list(self.meta.argv)[1:]
        now_args = redact_argv(list(sys.argv))[1:]
        if rec_args != now_args:
            self.note(f"the script's arguments differ from the recording: recorded {rec_args}, now {now_args}")

    # -- the loop ----------------------------------------------------------------------

    def restorable(self, epoch: int) -> bool:
        blocks = self.meta.epoch_blocks.get(str(epoch))
        return bool(blocks) and all((name, epoch, occ) in self.available for name, occ in blocks)

    def loop_length(self, iterable: Any) -> int:
        """The items this worker's loop yields: its initialization epochs, then its segment."""
        plan = self.loop_plan(iterable)
        return max(0, plan.stop - plan.first)

    def loop_plan(self, iterable: Any) -> ReplayPlan:
        """This worker's plan for the loop over ``iterable``, made once: ``len(flor.it(...))``
        (tqdm's total) may ask before the loop starts."""
        if self.plan is not None:
            return self.plan
        try:
            length: int | None = len(iterable)
        except TypeError:
            length = None
        planned = self.meta.epochs_planned
        if length is not None and planned is not None and length != planned:
            raise ReplayError(
                f"the epoch loop now has {length} epochs but the recording {self.run} had {planned}: "
                "replay with the recorded arguments, or record again"
            )
        epochs = self.meta.epochs  # exactly the epochs the recording ran (RunMeta.epochs decides)
        if length is not None:
            epochs = min(epochs, length)
        if self.recording_alive:
            self.note(f"the recording is still running: replaying the {epochs} epochs it has finished")
        elif self.meta.status == "running":
            self.note(f"the recording ended after {epochs} epochs (its process is gone); replaying those")
        elif self.meta.stopped_early or (planned is None and self.meta.status != "finished"):
            self.note(f"the recording ran {self.meta.epochs_text()} epochs; replaying epochs 0-{epochs - 1}"
                      if epochs else f"the recording ran {self.meta.epochs_text()} epochs; there is nothing to replay")
        restorable = {e for e in range(epochs) if self.restorable(e)}
        within = select(epochs, self.settings.epoch_range) if self.settings.epoch_range else None
        if within is not None and len(within) == 0:
            raise ReplayError(f"--flor_epochs {self.settings.epoch_range[0]}:{self.settings.epoch_range[1] or ''} "
                              f"selects no epoch of the recording's {epochs}: epochs are 0 to {epochs - 1}")
        plan = make_plan(epochs, self.pid, self.ngpus, restorable, strong=self.settings.strong, within=within)
        while self._drop_damaged(range(plan.first, plan.stop)):  # what a damaged manifest held is not restorable
            restorable = {e for e in range(epochs) if self.restorable(e)}
            plan = make_plan(epochs, self.pid, self.ngpus, restorable, strong=self.settings.strong, within=within)
        for text in check_replay_world(self.ngpus, self.meta, plan, restorable):
            self.note(text)
        self.plan = plan
        if self.store.blobs.remote is not None:  # fetch the coming epochs' blobs from S3 ahead of need
            from ..store.sync import prefetch_plan

            prefetch_plan(self.store, self.run, self.meta, range(plan.first, plan.stop), self.available)
        self.anchored = plan.first == 0
        seg = f"{plan.segment.start}-{plan.segment.stop - 1}" if len(plan.segment) else "none"
        init = f"{plan.init.start}-{plan.init.stop - 1}" if len(plan.init) else "none"
        self.summary.header = (f"flor: replay {self.replay_id} of {self.settings.name} run {self.run}, worker "
                               f"{self.pid}/{self.ngpus}: epochs {seg} (initialization epochs {init})")
        return plan

    def _drop_damaged(self, epochs: range) -> bool:
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
                    self.note(f"{exc}; replay re-executes that epoch from the nearest earlier checkpoint")
                    dropped = True
                else:
                    if name in self.meta.grads_carried and "grads" not in manifest:
                        self.available.discard(key)
                        self.note(f"block {name!r} adds to the gradients its previous run left (run.json: "
                                  f"grads_carried) and its checkpoint at epoch {epoch} holds none (taken before flor "
                                  "noticed, or its gradients could not be stored): replay re-executes that epoch from the nearest earlier checkpoint")
                        dropped = True
                        continue
                    self._sound.add(key)
        return dropped

    def _pickles(self, manifest: dict) -> Any:
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

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        plan = self.loop_plan(iterable)
        if self.loop_wrapper is not None and not (plan.first > 0 and self.loop_wrapper in WRONG_MID_RUN):
            self.note(wrapper_advice(self.loop_wrapper))
        try:
            seen = 0
            for epoch, item in enumerate(iterable):
                seen = epoch + 1
                if epoch < plan.first:
                    continue
                if epoch >= plan.stop:
                    if epoch == self.meta.epochs and self.meta.loop_ended == "break":
                        self.summary.loop.append(
                            f"loop: the recording left the loop after epoch {epoch - 1} (a break: early stopping) "
                            f"but the replayed loop went on to epoch {epoch}; likely cause: state the stopping "
                            "rule reads was not restored (see the notes) or the training code changed")
                    break
                self.epoch, self.initializing = epoch, epoch < plan.segment.start
                self.mark("epoch", epoch, init=self.initializing)
                if epoch == plan.first and epoch > 0:
                    self._restore_outer(epoch - 1)
                    if self.loop_wrapper in WRONG_MID_RUN:  # what it counts or pairs starts here, not at 0
                        self.summary.loop.append(f"loop: {wrapper_advice(self.loop_wrapper)}, or replay with "
                                                 "--flor_strong (every epoch from 0)")
                try:
                    yield item
                except GeneratorExit:
                    if left_normally(self.loop_frame) and epoch < self.meta.epochs - 1:
                        self.summary.loop.append(
                            f"loop: the replayed loop stopped after epoch {epoch} (a break or return) but the "
                            f"recording went on to epoch {self.meta.epochs - 1}; likely cause: state the stopping "
                            "rule reads was not restored (see the notes) or the training code changed")
                    raise
                self.close_left_open("at the end of the epoch")
                self.logs.flush()
            else:
                if seen < plan.stop:
                    self.note(f"the loop ended after {seen} epochs, before the planned {plan.stop}")
        finally:
            self.mark("after")
            self.end_loop()
            self.initializing = False

    def _restore_outer(self, after: int) -> None:
        """Give the loop's own variables (best value, patience, EMA, counters) the values the
        recording had at the end of epoch ``after``, before this worker's first epoch."""
        frame = self.loop_frame
        if frame is None:
            return
        loop = LoopFrame(frame)
        try:
            rec = read_outer_state(self.layout.outer_state, after)
            if rec is None:
                self.note(f"the recording has no outer-loop state for epoch {after} (its write failed, or the "
                          "file is damaged): variables of the loop outside end() start as the script sets them "
                          "before the loop; replay with --flor_strong if they matter")
                return
            values, missing = {}, list(rec["unrestorable"])
            own = set(rec["unchanged"]) & set(rec["vars"])
            for name, node in rec["vars"].items():
                if name in own:  # the loop had not changed it: as this worker's code before the loop set it
                    continue
                try:
                    values[str(name)] = decode(node)
                except (ValueError, TypeError, AttributeError):
                    missing.append(str(name))
            missing += loop.restore(values)
            self.outer_restored = sorted(set(values) - set(missing))
            if self.outer_restored:
                self.note(f"outer-loop variables restored as recorded at the end of epoch {after}: "
                          f"{listed(self.outer_restored, 12)}")
            if own:
                self.note(f"outer-loop variables the recording's loop had not changed by epoch {after}, left as "
                          f"this worker set them before the loop: {listed(sorted(own), 12)}")
        finally:
            loop.close()
        if missing:
            names = ", ".join(sorted(set(missing)))
            text = (f"outer-loop variables of {loop.where} that this worker (starting at epoch {after + 1}) "
                    f"cannot restore: {names}. They are not plain data (or too big) and changed in the loop; "
                    "pass them to SkipBlock.end(), or replay with --flor_strong")
            if self.settings.strict:
                raise ReplayError(text + " (--flor_strict)")
            self.note(text)
            self._unrestored(missing)

    # -- blocks ------------------------------------------------------------------------

    def _check_recorded(self, name: str, epoch: int | None, occ: int) -> None:
        if epoch is None:
            recorded = self.meta.outside_blocks
            finished = self.meta.status == "finished"
        else:
            recorded = self.meta.epoch_blocks.get(str(epoch))
            finished = recorded is not None
        if finished and [name, occ] not in recorded:
            where = "outside the loop" if epoch is None else f"at epoch {epoch}"
            names = sorted({n for n, _ in recorded}) or "none"
            raise ReplayError(
                f"SkipBlock {name!r} (occurrence {occ}) {where} is not in the recording {self.run}, whose "
                f"blocks there were {names}: the script's blocks no longer match; rename the block back "
                f"or record again with --flor {self.settings.name}"
            )

    def step_into(self, name: str, probed: bool) -> bool:
        _, epoch, occ = self.open_block(name)
        self._check_recorded(name, epoch, occ)
        self._changed_outside(name, epoch, occ)
        if name not in self.forgotten_checked and name not in self.sites:
            self.sites[name] = block_site(caller_frame())
        checkpointed = (name, epoch, occ) in self.available
        action = block_action(checkpointed=checkpointed, probed=probed, initializing=self.initializing)
        manifest = cache = None
        if checkpointed:
            t0 = time.perf_counter()
            try:
                if action == "restore":
                    manifest, cache = self._fetch((name, epoch, occ))
                    if self.rng_exact:
                        self._drawn_outside(manifest, name, epoch)
                    self.io["restore_bytes"] += sum(len(v) for v in cache.values())
                    self._prefetch_next(name, epoch, occ, probed)
                else:
                    manifest = self.store.read_manifest(self.run, name, epoch, occ)
                    self._start_like_recording(manifest, name, epoch)
            except ConfigError:  # this process cannot replay the recording (its GPUs): not the checkpoint
                raise
            except FlorError as exc:
                if not self.anchored:
                    raise CheckpointError(
                        f"the checkpoint of {name!r} at epoch {epoch} cannot be read ({exc}); replay "
                        "with --flor_strong to rebuild this worker's state from epoch 0"
                    ) from exc
                self.note(f"checkpoint of {name!r} at epoch {epoch} is unusable ({exc}); re-executing it")
                action, manifest, cache = "execute", None, None
            self.io["load_s"] += time.perf_counter() - t0
        self.pending = (action, manifest, cache)
        return action == "execute"

    def _start_like_recording(self, manifest: dict, name: str, epoch: int | None) -> None:
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
            if not self._rng_noted:
                self._rng_noted = True
                self.note(f"the {', '.join(differs)} random state at the start of {name!r} (epoch {epoch}) "
                          "differed from the recording (is that generator seeded?); flor set it as recorded")

    def _rng_start_differs(self, manifest: dict) -> list[str]:
        """The global generators whose state now is not the one the block started from when recorded."""
        from ..state import capture_rng, diff_rng, snapshot

        captured = capture_rng()
        now = snapshot(captured, copy=False).materialize()
        return sorted({p.split(".")[0].split("[")[0]
                       for p in diff_rng(manifest["rng_start"], now, self._undrawn(manifest, "rng_start", captured))})

    def _drawn_outside(self, manifest: dict, name: str, epoch: int | None) -> None:
        """Before a block this replay restores, with the random state exact at the last block's
        end: a generator that is not where the recording had it here was drawn from by code
        outside the blocks that the recording did not run (a hindsight line that samples).
        Restoring sets the recorded state, so what follows is the recording's training, not a
        full run of the edited script's: said once, as a note and in the verdict's cause."""
        if self._outside_noted or "rng_start" not in manifest:
            return
        differs = self._rng_start_differs(manifest)
        if differs:
            self._outside_noted = True
            self.note(f"code outside the blocks drew from the {', '.join(differs)} random generator before "
                      f"{name!r} at epoch {epoch} where the recording did not (a hindsight line that samples?); "
                      "restoring the block set the recorded state, so later values are the recording's "
                      "training, not a full run of this script's; to leave training's randomness alone, "
                      "draw from a torch.Generator of your own in hindsight code")

    def _recorded_rng(self, manifest: dict, key: str) -> dict:
        """A checkpoint's recorded random state (``rng`` or ``rng_start``), decoded."""
        from ..state import decode

        cache = self.store.blobs.get_many(blob_hashes(manifest[key]))
        return decode(manifest[key], cache.__getitem__, path=key, pickles=self._pickles(manifest))

    def _undrawn(self, manifest: dict, key: str, captured: dict) -> Callable[[int, int], bool]:
        """``diff_rng``'s check of the CUDA generators only one side has a device for: nothing
        drew from them, in the recording (its blobs are read only then) or in this process."""
        from ..state import cuda_undrawn

        def undrawn(recorded: int, now: int) -> bool:
            state = self._recorded_rng(manifest, key)
            return isinstance(state, dict) and cuda_undrawn(list(state.get("cuda", []))[now:]) \
                and cuda_undrawn(list(captured.get("cuda", []))[recorded:])

        return undrawn

    def _load(self, key: tuple[str, int | None, int]) -> tuple[dict, dict[str, bytes]]:
        """A checkpoint's manifest and the verified bytes of every blob it names."""
        manifest = self.store.read_manifest(self.run, *key)
        return manifest, self.store.blobs.get_many(blob_hashes(manifest))

    def _fetch(self, key: tuple[str, int | None, int]) -> tuple[dict, dict[str, bytes]]:
        future = self._prefetched.pop(key, None)
        return future.result() if future is not None else self._load(key)

    def _prefetch_next(self, name: str, epoch: int | None, occ: int, probed: bool) -> None:
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
        self._prefetched[key] = self._reader.submit(self._load, key)

    def _restore(self, manifest: dict, cache: dict, objs: tuple) -> tuple:
        from ..state import restore_all
        from ..state.grads import restore_grads

        t0 = time.perf_counter()
        try:
            restored = restore_all(list(objs), manifest["objects"], manifest["rng"], cache.__getitem__,
                                   pickles=self._pickles(manifest))
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
        self.io["restore_s"] += time.perf_counter() - t0
        self.anchored = self.from_restore = self.rng_exact = True
        return tuple(restored)

    def _restore_block_vars(self, name: str, epoch: int | None, occ: int) -> None:
        """Set the plain-data variables the recorded block run changed outside ``end()`` (a step
        counter, a loss sum, a history) as they were at its end (``flor.watch.variables.BlockVars``)."""
        noted = self._block_state().get((epoch, name, occ))
        if not noted or not any(noted[part] for part in ("vars", "globals", "attrs")):
            return
        missing: list[str] = []

        def decoded(found: dict[str, Any], prefix: str = "") -> dict[str, Any]:
            out = {}
            for var, node in found.items():
                try:
                    out[var] = decode(node)
                except (ValueError, TypeError, AttributeError):
                    missing.append(prefix + var)
            return out

        values, module = decoded(noted["vars"]), decoded(noted["globals"])
        attrs = {var: decoded(found, f"{var}.") for var, found in noted["attrs"].items()}
        named = set(values) | set(module) | {f"{var}.{attr}" for var, found in attrs.items() for attr in found}
        frame = caller_frame()
        if frame is None:
            missing += sorted(named)
        else:
            lf = LoopFrame(frame)
            missing += lf.restore(values) + restore_globals(frame, module) + restore_attrs(lf.variables(), attrs)
        if name not in self._block_vars_noted:
            self._block_vars_noted.add(name)
            done = sorted(named - set(missing))
            if done:
                self.note(f"variables block {name!r} changes outside end() are set as recorded where it is "
                          f"restored: {listed(done, 12)}")
            if missing:
                self.note(f"variables block {name!r} changes outside end() that could not be set where it is "
                          f"restored: {listed(sorted(missing), 12)}; pass them to SkipBlock.end")
                self._unrestored(missing)

    def _block_state(self) -> dict:
        if self._block_vars is None:
            self._block_vars = read_block_state(self.layout.block_state)
        return self._block_vars

    def _changed_outside(self, name: str, epoch: int | None, occ: int) -> None:
        """Tensors of the modules the block's last ``end()`` was given that code since changed
        in place where the recording's did not (``OutsideChanges``): a hindsight line that
        trains, or runs the model in training mode. Said once, and in the verdict."""
        changed = self.outside.started()
        if not changed or self.summary.outside:
            return
        recorded = (self._block_state().get((epoch, name, occ)) or {}).get("outside", {})
        new = [path for path, ops in changed.items() if recorded.get(path) != ops]
        if new:
            self.summary.outside = new
            self.note(f"code outside the blocks changed {listed(new, 4)} in place before {name!r} at epoch {epoch}, "
                      "where the recorded script did not (a hindsight line that runs the model in training mode "
                      "updates BatchNorm statistics; one that steps an optimizer changes the weights): a full run of "
                      "this script trains on from there, while this replay restores or re-executes the recorded "
                      "training, so its later values are not a full run's; evaluate on a copy "
                      "(copy.deepcopy(model).eval()) or under model.eval()")

    def _unrestored(self, names: list[str]) -> None:
        """State this replay knows it did not set as a full run has it, for the verdict."""
        self.summary.unrestored = sorted(set(self.summary.unrestored) | set(names))

    def left_open(self, key: tuple[str, int | None, int]) -> None:
        """An exception (or ``continue``) skipped the block's ``end``, as it did in the recording,
        which has no checkpoint of it then: the block was executed and is left as it is."""
        name, epoch, occ = key
        self.pending = None
        self.summary.events.append(BlockEvent(epoch, name, occ, "executed (no checkpoint)",
                                              initializing=self.initializing))

    def end(self, objs: tuple) -> Any:
        name, epoch, occ = self.close_block()
        assert self.pending is not None
        action, manifest, cache = self.pending
        self.pending = None
        if manifest is not None and manifest.get("count", len(objs)) != len(objs):
            recorded = (manifest.get("objects") or {}).get("v") or []
            raise StateError(arity_message(name, epoch, list(recorded), objs))
        event = BlockEvent(epoch, name, occ, "restored", initializing=self.initializing)
        if action == "restore":
            objs = self._restore(manifest, cache, objs)
            self._restore_block_vars(name, epoch, occ)
            if name not in self.forgotten_checked:  # once a block, as the recording warned
                self.forgotten_checked.add(name)
                stale = stale_at_end(self.sites.pop(name, None), caller_frame())  # read after it, left as they were
                noted = {var for (_, block, _), found in self._block_state().items() if block == name
                         for part in (found["vars"], found["globals"]) for var in part}  # set as recorded instead
                stale = [var for var in stale if var not in noted]
                forgotten = forgotten_in_replay(name, objs)
                for text in [note for _, note in forgotten] + stale_note(name, stale):
                    self.note(text)
                self._unrestored([var for var, _ in forgotten] + stale)
        elif manifest is None:
            event.action = "executed (no checkpoint)"
            self.rng_exact = False
        else:
            objs, event = self._verify(manifest, objs, event)
        self.summary.events.append(event)
        self.outside.ended(objs)
        return as_result(objs)

    def _verify(self, manifest: dict, objs: tuple, event: BlockEvent) -> tuple[tuple, BlockEvent]:
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
        if self.code_changed:
            event.cause = CAUSE_CODE
        elif not diffs:
            event.cause = CAUSE_RNG
        elif self.from_restore:
            event.cause = CAUSE_NOT_PASSED
        else:
            event.cause = CAUSE_NONDET
        cache = self.store.blobs.get_many(blob_hashes(manifest))
        return self._restore(manifest, cache, objs), event  # go on from the recorded state

    @staticmethod
    def _label(path: str, manifest: dict) -> str:
        if not path.startswith("["):
            return path
        index, _, rest = path[1:].partition("]")
        try:
            node = manifest["objects"]["v"][int(index)]
            cls = node.get("cls", node.get("t", "")) if isinstance(node, dict) else type(node).__name__
        except (ValueError, IndexError, KeyError, TypeError):
            return path
        return f"end() argument {index} ({cls.rsplit('.', 1)[-1]}){rest}"

    # -- logs and exit -----------------------------------------------------------------

    def write_log(self, name: str, value: Any, step: Any) -> None:
        if self.loop == "in":
            if self.initializing:
                return
        elif self.loop == "before":
            if self.pid != 0:
                return
        elif not (self.plan.reports_after if self.plan else self.pid == self.ngpus - 1):
            return
        super().write_log(name, value, step)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.mark("end", worker=self.pid, ngpus=self.ngpus)
        self.logs.flush()
        records = read_run_logs(self.run_dir, self.run)
        recorded = [r for r in records if r["source"] == "record"]
        mine = [r for r in records if r["source"] == "replay" and r["replay"] == self.replay_id
                and r["worker"] == self.pid]
        unwritten = self.logs.unwritten  # a read-only or full store: the values are checked all the same
        if unwritten or self.logs.lost:
            tag = {"run": self.run, "source": "replay", "replay": self.replay_id, "worker": self.pid}
            mine = occurrence_keys([{**r, **tag} for r in mine] + [{**r, **tag} for r in unwritten])
            self.note(f"{len(unwritten) + self.logs.lost} of this worker's logged values could not be written "
                      f"to {self.logs.path}: they are checked below but not stored; free the disk or make the "
                      "store writable and replay again to keep them")
        try:
            write_replay_events(self.layout.tb_replay(self.replay_id), self.pid, mine, recorded,
                                int(self.meta.epochs_done or 0))
        except OSError as exc:
            print(f"flor: could not write TensorBoard events: {exc}", file=sys.stderr)
        s = self.summary
        if not s.header:
            s.header = f"flor: replay {self.replay_id} of {self.settings.name} run {self.run}, worker {self.pid}/{self.ngpus}"
        s.shared_logs, s.log_mismatches, s.hindsight = compare_logs(recorded, mine, key=record_key, same=same_value)
        if s.log_mismatches:
            if any(e.action == "diverged" for e in s.events):
                s.log_cause = "it follows from the diverged blocks above"
            elif self.code_changed:
                s.log_cause = CAUSE_CODE
            else:
                s.log_cause = ("code outside the blocks depends on state that was not passed to end(), "
                               "or on randomness drawn inside a block")
        s.notes = self.notes
        s.lenient = self.settings.lenient
        s.failed = f"{self.exit_error}: {self.exit_detail}" if self.exit_detail else self.exit_error  # names why
        try:
            # atomic (temp file, rename): a link planted at the summary's name is replaced, never written through
            self.store.backend.write(self.summary_path.relative_to(self.store.root).as_posix(), json.dumps({
                "replay": self.replay_id, "run": self.run, "worker": self.pid, "ngpus": self.ngpus,
                "segment": [self.plan.segment.start, self.plan.segment.stop] if self.plan else None,
                "init": [self.plan.init.start, self.plan.init.stop] if self.plan else None,
                "exit": self.exit_error, "io": self.io, "outer_restored": self.outer_restored, **s.to_json(),
                "lenient": self.settings.lenient, "script_sha256": _script_sha256(),  # the script the values came from
            }, indent=1, default=str).encode(), durable=False)
        except (OSError, StorageError) as exc:
            print(f"flor: could not write {self.summary_path}: {exc}", file=sys.stderr)
        report = s.render(shown=self.notes)  # the notes were printed as they came
        print(report, file=sys.stderr)
        sys.stderr.flush()
        self.untee_output()
        if self.settings.spool and self.store.blobs.remote is not None:  # this worker's logs join the spooled run
            from ..store.sync import spool_files

            outputs = [self.logs.path, self.summary_path, self.layout.replay_output(self.replay_id, self.pid)]
            keys = [p.relative_to(self.store.root).as_posix() for p in outputs]
            spool_files(self.store, self.settings.spool, keys)
        if s.diverged and not self.settings.lenient and self.exit_error is None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(3)


def _script_sha256() -> str | None:
    """sha256 of the script this process runs (``sys.argv[0]``): the version its logged values came from."""
    import hashlib

    try:
        return hashlib.sha256(Path(sys.argv[0]).read_bytes()).hexdigest() if sys.argv and sys.argv[0] else None
    except OSError:
        return None

