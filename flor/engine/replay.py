"""Replay: follow the plan, restore or execute each block, verify, and report.

A ``ReplaySession`` is built from parts it owns: the run's checkpoints (``Restorer``: sound
manifests, fetch, prefetch, restore, verify, the random state around blocks), the probes of the
script's state outside ``end()`` (``flor.watch.Watch``) and the loop's own variables
(``flor.watch.loop.LoopState``); the report is ``flor.verify.Summary``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from .._fmt import printable
from ..errors import CheckpointError, ConfigError, FlorError, StateError, StorageError
from ..logs import LogWriter, occurrence_keys, record_key, same_value
from ..logs.tensorboard import write_replay_events
from ..placement import new_replay_id, pid_alive
from ..plan import ReplayPlan, block_action
from ..settings import Settings
from ..source.blocks import WRONG_MID_RUN, wrapper_advice
from ..state.describe import arity_message
from ..store.layout import RunLayout
from ..store.runlogs import check_write_folders, read_run_logs, retire_worker_files
from ..verify import BlockEvent, Summary, never_ran
from ..watch.carried import CarriedProbe
from ..watch.draws import DrawsProbe, recorded_draws
from ..watch.frames import caller_frame, left_normally
from ..watch.loop import LoopState, State, read_state
from ..watch.names import NamesProbe
from ..watch.outside import OutsideProbe
from ..watch.probe import Watch
from ..watch.reachable import SchedulerProbe
from ..watch.variables import VariablesProbe
from .ddp import shared_replay_id
from .effects import FileWrites, recorded_writes
from .restorer import Restorer, with_spool
from .script import compare_script, script_sha256
from .session import Session, as_result
from .trackers import export_at_end, recorded_mlflow_run
from .worker_plan import plan_loop

__all__ = ["ReplaySession"]


class ReplaySession(Session):
    mode = "replay"

    def __init__(self, settings: Settings) -> None:
        import torch

        super().__init__(settings)
        from .._fmt import progress
        from ..store.sync import attach_spool

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
        self.store = with_spool(self.store, self.run, self.meta, settings, remote)  # evicted blobs come back from S3
        self.run_dir = self.store.run_path(self.run)
        self.replay_id = settings.replay_id or shared_replay_id(settings) or new_replay_id()
        self.pid, self.ngpus = settings.pid, settings.ngpus
        self.plan: ReplayPlan | None = None
        self.initializing = False
        self.pending: tuple[str, dict | None, dict | None] | None = None
        self.notes: list[str] = []
        self.checkpoints = Restorer(self.store, self.run, self.meta, settings, self.note)
        # the script's state outside end() (flor.watch): set as recorded where a block is restored
        self.watch = Watch([VariablesProbe(), CarriedProbe(), SchedulerProbe(), NamesProbe(), OutsideProbe(),
                            DrawsProbe(recorded_draws(self.meta.extra))],
                           lambda code, subject, text: self.note(code, text), replay=True)
        self._state: State | None = None  # logs/state.jsonl, read when first needed
        if picked:
            self.note("FL301", picked)
        self.outer_restored: list[str] = []  # the loop's own variables this worker set as recorded
        self.layout = RunLayout(self.run_dir)
        check_write_folders(self.run_dir, self.store.root, self.replay_id)  # no link out of the store
        earlier = retire_worker_files(self.run_dir, self.replay_id, self.pid)  # a rerun starts clean
        self.logs = LogWriter(self.layout.replay_log(self.replay_id, self.pid))
        self.summary_path = self.layout.replay_summary(self.replay_id, self.pid)
        self.tee_output(self.layout.replay_output(self.replay_id, self.pid))

        status = self.meta.status
        self.recording_alive = status == "running" and bool(self.meta.pid) and pid_alive(int(self.meta.pid or 0))
        if status == "running" and not self.recording_alive:  # (a live one: noted with its epochs by loop_plan)
            self.note("FL302", "the recording did not finish (its process is gone: killed or crashed); "
                      "epochs without checkpoints are re-executed")
        elif status not in ("running", "finished"):
            self.note("FL303", f"the recording ended as {status!r}; epochs without checkpoints are re-executed")
        recorded_threads = self.meta.threads  # range-checked: a damaged value never reaches torch
        if earlier is not None:
            self.note("FL304", f"worker {self.pid} of replay {self.replay_id} ran before; "
                               f"its earlier output is in {earlier}")
        if settings.threads is not None:  # asked for: faster with many workers on one machine, not bit-exact
            if settings.threads != recorded_threads:
                self.note("FL305", f"using {settings.threads} torch threads (--flor_threads), not the recorded "
                          f"{recorded_threads}: values may differ from the recording in the last bits")
            torch.set_num_threads(settings.threads)
        elif recorded_threads and torch.get_num_threads() != recorded_threads:
            self.note("FL306", f"using {recorded_threads} torch threads as recorded (this process had "
                      f"{torch.get_num_threads()}), so that results are bit-identical")
            torch.set_num_threads(int(recorded_threads))
        self.checkpoints.code_changed, self.new_logs = compare_script(self.meta, self.run_dir, self.note)
        # a hindsight flor.log in a block, or in a function it calls: its runs are re-executed, as probed=True
        self.log_blocks = {block: log for log in reversed(self.new_logs) for block in log.blocks}
        self.summary = Summary(header="")
        self.writes = FileWrites([settings.home, settings.config_dir], recorded_writes(self.meta.extra), self._rewrote)
        self._install_hooks()

    @property
    def script_tb(self) -> Path:
        """Where the script's own SummaryWriter writes in this replay (flor.engine.trackers)."""
        return self.layout.tb_replay(self.replay_id) / f"script-{self.pid}"

    def recorded_mlflow_run(self) -> str | None:
        return recorded_mlflow_run(self.meta)

    def note(self, code: str, text: str) -> None:
        """Say finding ``code`` with ``text`` now, once; the summary file keeps it (``FL309 text``), the
        printed summary does not repeat it."""
        text = f"{code} {text}"
        if text in self.notes:
            return
        self.notes.append(text)
        print(f"flor: {printable(text)}", file=sys.stderr)  # it may quote the store (recorded argv, names)

    # -- the loop ----------------------------------------------------------------------

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
        plan = plan_loop(length, meta=self.meta, run=self.run, alive=self.recording_alive, checkpoints=self.checkpoints,
                         store=self.store, settings=self.settings, pid=self.pid, ngpus=self.ngpus, note=self.note)
        self.plan = self.checkpoints.plan = plan
        self.checkpoints.anchored = plan.first == 0
        seg = f"{plan.segment.start}-{plan.segment.stop - 1}" if len(plan.segment) else "none"
        init = f"{plan.init.start}-{plan.init.stop - 1}" if len(plan.init) else "none"
        self.summary.header = (f"flor: replay {self.replay_id} of {self.settings.name} run {self.run}, worker "
                               f"{self.pid}/{self.ngpus}: epochs {seg} (initialization epochs {init})")
        return plan

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        plan = self.loop_plan(iterable)
        if self.loop_wrapper is not None and not (plan.first > 0 and self.loop_wrapper in WRONG_MID_RUN):
            self.note("FL209", wrapper_advice(self.loop_wrapper))
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
                    self.checkpoints.rng_exact = False  # the epochs skipped before drew: no FL325 from them
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
                    self.note("FL318", f"the loop ended after {seen} epochs, before the planned {plan.stop}")
        finally:
            self.mark("after")
            self.end_loop()
            self.initializing = False

    def _restore_outer(self, after: int) -> None:
        """Give the loop's own variables (best value, patience, EMA, counters) the values the
        recording had at the end of epoch ``after``, before this worker's first epoch."""
        if self.loop_frame is None:
            return
        restored, missing = LoopState(self.loop_frame).restore(
            self._read_state(), after, lambda code, subject, text: self.note(code, text), strict=self.settings.strict)
        self.outer_restored = restored
        self._unrestored(missing)

    # -- blocks ------------------------------------------------------------------------

    def step_into(self, name: str, probed: bool) -> bool:
        _, epoch, occ = self.open_block(name)
        if not probed and name in self.log_blocks:
            probed = True
            log = self.log_blocks[name]
            self.note("FL339", f"block {name!r} is re-executed where a checkpoint exists, as probed=True does: the "
                      f"script adds {log.call()} at {log.where()}, which its runs execute")
        self.checkpoints.check_recorded(name, epoch, occ)
        # what code since the last end() changed in place where the recording's did not (flor.watch.outside)
        recorded = {"outside": self._read_state().outside.get((epoch, name, occ), {})}
        outside = self.watch.enter(name, epoch, occ, caller_frame(), recorded)
        if outside and not self.summary.outside:
            self.summary.outside = outside
        cp = self.checkpoints
        checkpointed = (name, epoch, occ) in cp.available
        action = block_action(checkpointed=checkpointed, probed=probed, initializing=self.initializing)
        manifest = cache = None
        if checkpointed:
            t0 = time.perf_counter()
            try:
                if action == "restore":
                    manifest, cache = cp.fetch((name, epoch, occ))
                    if cp.rng_exact:
                        cp.drawn_outside(manifest, name, epoch)
                    cp.io["restore_bytes"] += sum(len(v) for v in cache.values())
                    cp.prefetch_next(name, epoch, occ, probed)
                else:
                    manifest = self.store.read_manifest(self.run, name, epoch, occ)
                    cp.start_like_recording(manifest, name, epoch)
            except ConfigError:  # this process cannot replay the recording (its GPUs): not the checkpoint
                raise
            except FlorError as exc:
                if not cp.anchored:
                    raise CheckpointError(
                        f"the checkpoint of {name!r} at epoch {epoch} cannot be read ({exc}); replay "
                        "with --flor_strong to rebuild this worker's state from epoch 0"
                    ) from exc
                self.note("FL315", f"checkpoint of {name!r} at epoch {epoch} is unusable ({exc}); re-executing it")
                action, manifest, cache = "execute", None, None
            cp.io["load_s"] += time.perf_counter() - t0
        self.pending = (action, manifest, cache)
        return action == "execute"

    def _rewrote(self, path: str) -> None:
        """The script writes a file the recording wrote (flor.engine.effects): said once a path."""
        self.summary.rewrote.append(path)
        self.note("FL340", f"this replay writes {path}, which the recording wrote too (torch.save, open(..., 'w'), "
                  "a plot): it now holds what the replay's order of epochs left there, and every worker of a launch "
                  "writes it; guard the write with `if not flor.replaying():`")

    def _read_state(self) -> State:
        """``logs/state.jsonl``: the loop's variables by epoch, the changes outside the blocks (read once)."""
        if self._state is None:
            self._state = read_state(self.layout.state)
        return self._state

    def _unrestored(self, names: list[str]) -> None:
        """State this replay knows it did not set as a full run has it, for the verdict."""
        self.summary.unrestored = self.checkpoints.missing = sorted(set(self.summary.unrestored) | set(names))

    def left_open(self, key: tuple[str, int | None, int]) -> None:
        """An exception (or ``continue``) skipped the block's ``end``, as it did in the recording,
        which has no checkpoint of it then: the block was executed and is left as it is."""
        name, epoch, occ = key
        self.pending = None
        self.watch.drop()
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
        cp = self.checkpoints
        restored = None
        if action == "restore":
            assert manifest is not None and cache is not None  # step_into fetched both to restore
            objs = cp.restore(manifest, cache, objs)
            # set as recorded: the block's variables outside end(), the values its next run reads first
            restored = {**manifest.get("watch", {}), "carried_values": cp.carried}
        elif manifest is None:
            event.action = "executed (no checkpoint)"
            cp.rng_exact = False
        else:
            objs, event = cp.verify(manifest, objs, event)
        compared = None
        if manifest is not None and action != "restore":  # re-executed from its checkpoint: compared with it
            compared = {**manifest.get("watch", {}), "carried_tree": manifest.get("carried")}
        _, found = self.watch.leave(caller_frame(), objs, restored, compared)
        if compared is not None and found:  # the block's variables outside end() differ from the recording's
            event = cp.diverged(event, found)
        elif action == "restore":
            self._unrestored(found)
        self.summary.events.append(event)
        return as_result(objs)

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
        self.writes.close()
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
            self.note("FL330", f"{len(unwritten) + self.logs.lost} of this worker's logged values could not be written "
                      f"to {self.logs.path}: they are checked below but not stored; free the disk or make the "
                      "store writable and replay again to keep them")
        try:
            write_replay_events(self.layout.tb_replay(self.replay_id), self.pid, mine, recorded,
                                int(self.meta.epochs_done or 0))
        except OSError as exc:
            print(f"flor: FL331 could not write TensorBoard events: {exc}", file=sys.stderr)
        s = self.summary
        if self.new_logs and not self.settings.epoch_range and self.exit_error is None:
            ran = {r["name"] for r in mine}  # a whole replay: a new log that wrote nothing never ran
            named = [(log.name, f"{log.call()} at {log.where()}") for log in self.new_logs if log.name is not None]
            if self.ngpus == 1:
                for name, where in named:
                    if name not in ran:
                        self.note("FL338", never_ran(where, "in this replay"))
            else:  # a segment: where the others ran it, the launch's merged summary knows (flor.launch.report)
                s.new_logs = [[name, where] for name, where in named]
                s.ran_new = sorted({name for name, _ in named if name in ran})
        if not s.header:
            s.header = (f"flor: replay {self.replay_id} of {self.settings.name} run {self.run}, "
                        f"worker {self.pid}/{self.ngpus}")
        s.check_logs(recorded, mine, key=record_key, same=same_value, code_changed=self.checkpoints.code_changed)
        s.notes = self.notes
        s.lenient = self.settings.lenient
        s.failed = f"{self.exit_error}: {self.exit_detail}" if self.exit_detail else self.exit_error  # names why
        try:
            # atomic (temp file, rename): a link planted at the summary's name is replaced, never written through
            self.store.backend.write(self.summary_path.relative_to(self.store.root).as_posix(), json.dumps({
                "replay": self.replay_id, "run": self.run, "worker": self.pid, "ngpus": self.ngpus,
                "segment": [self.plan.segment.start, self.plan.segment.stop] if self.plan else None,
                "init": [self.plan.init.start, self.plan.init.stop] if self.plan else None,
                "exit": self.exit_error, "io": self.checkpoints.io, "outer_restored": self.outer_restored,
                **s.to_json(),
                "lenient": self.settings.lenient, "script_sha256": script_sha256(),  # the script the values came from
            }, indent=1, default=str).encode(), durable=False)
        except (OSError, StorageError) as exc:
            print(f"flor: FL331 could not write {self.summary_path}: {exc}", file=sys.stderr)
        report = s.render(shown=self.notes)  # the notes were printed as they came
        print(printable(report), file=sys.stderr)
        sys.stderr.flush()
        self.untee_output()
        if self.settings.spool and self.store.blobs.remote is not None:  # this worker's logs join the spooled run
            from ..store.sync import spool_files

            outputs = [self.logs.path, self.summary_path, self.layout.replay_output(self.replay_id, self.pid)]
            keys = [p.relative_to(self.store.root).as_posix() for p in outputs]
            spool_files(self.store, self.settings.spool, keys)
        if self.settings.export:  # --flor_export: by a replay that covered every epoch alone
            export_at_end(self.store, self.run, self.settings, self.pid, self.ngpus)
        if s.exit_status and self.exit_error is None:  # diverged, or a condition of CONDITIONS: not exact
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(s.exit_status)
