"""Recording: run metadata, logs, stdout and a checkpoint of every block at every epoch.

A ``RecordSession`` is built from parts it owns: the run's run.json (``RunRecord``) and what it
notes of the run besides its epochs (``RunFacts``: source, git, GPUs, late hyperparameters), its
checkpoints (``Checkpointer``: the writer, the policy, the snapshot buffers), the probes of the
script's state outside ``end()`` (``flor.watch.Watch``) and the loop's own variables
(``flor.watch.loop.LoopState``). It keeps no state of its own per heuristic.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Iterator

from .. import hparams
from ..logs import LogWriter
from ..logs.summary import MetricTracker
from ..logs.tensorboard import RecordEvents
from ..placement import IdleMeter
from ..redact import redact_argv
from ..runinfo import busy_cores, process_started, script_info, versions
from ..settings import Settings
from ..source.blocks import wrapper_advice
from ..store import lock as store_lock
from ..store.layout import RunLayout
from ..store.runmeta import RunMeta
from ..watch.attributes import ModuleAttrProbe
from ..watch.carried import CarriedProbe
from ..watch.draws import DrawsProbe
from ..watch.frames import PassedIds, caller_frame, left_normally
from ..watch.grads import GradProbe
from ..watch.loop import LoopState, StateFile
from ..watch.names import NamesProbe
from ..watch.outside import OutsideProbe
from ..watch.probe import Watch
from ..watch.reachable import ContainerProbe, GeneratorProbe, SchedulerProbe
from ..watch.variables import VariablesProbe
from .checkpointer import Checkpointer
from .ddp import RankLink
from .effects import FileWrites
from .exits import watch_exits
from .runrecord import LEFT_OPEN, RunRecord
from .runfacts import RunFacts
from .session import Session, as_result, new_run_id
from .trackers import note_trackers

__all__ = ["LOOKAHEAD_EVERY_S", "META_EVERY_S", "META_WRITE_SHARE", "RecordSession"]

#: the longest run.json waits after an epoch that took no checkpoint ...
META_EVERY_S = 0.5
#: ... unless writing it took longer than this share of that wait: a run.json of many short epochs (a
#: block per iteration: ~45 bytes each, 27 MB at 600k) then waits this many times its last write
META_WRITE_SHARE = 50
#: after the look-ahead (``RecordSession._worker_may_start``) said no, it is asked again at most this
#: often while the epochs run the same blocks: a loop of short epochs (a block per iteration) does not
#: pay it at each (~7 µs); a checkpoint the budget allows meanwhile waits at most this much training
LOOKAHEAD_EVERY_S = 0.05


class RecordSession(Session):
    mode = "record"

    def __init__(self, settings: Settings) -> None:
        import torch

        super().__init__(settings)
        self.run = new_run_id()
        self.run_dir = self.store.run_path(self.run)
        self.store.root.mkdir(parents=True, exist_ok=True)
        self.store_lock = store_lock.shared(self.store.root)  # no repair while recording; held until the process ends
        self.run_dir.mkdir(parents=True)
        self.layout = RunLayout(self.run_dir)
        script = script_info(sys.argv[0] if sys.argv else "")
        self.meta = RunMeta(
            name=settings.name or "", run=self.run, pid=os.getpid(),
            argv=redact_argv(list(sys.argv), hparams.secret_flags()),
            cwd=os.getcwd(), script=script["script"], script_sha256=script["script_sha256"],
            versions=versions(), torch_threads=torch.get_num_threads(), started=self.started,
            hyperparameters=hparams.captured(), write_failures=self.write_failures,
        )
        self.record = RunRecord(self.store, self.meta, self.write_failed)
        self.facts = RunFacts(settings, self.record, self.layout, script["script"], write=self.write_meta,
                              closed=lambda: self._closed, write_failed=self.write_failed)
        self.checkpoints = Checkpointer(self.store, self.run, self.record, settings, self.warn_once)
        writer = self.checkpoints.writer
        # git's view of the script's tree, off the training thread: `git status` and `git diff` take
        # ~10 ms in a small repository and seconds in a large one
        writer.submit(self.facts.git, 0, lambda exc: None)
        # temp files of writers that died mid-write (a kill, a crash) take space: clear them off the training thread
        writer.submit(self.store.remove_stale_tmp, 0, lambda exc: None)
        writer.submit(self.facts.gpus, 0, lambda exc: None)
        self.spool = None
        if settings.spool:  # uploads run on their own thread: training never waits on the network
            from ..store.sync import BackgroundSpool
            from ..store.trust import remember_spool  # its replay may fetch evicted blobs from it

            self.meta.spool = settings.spool
            remember_spool(settings.config_dir, settings.spool)
            self.spool = self.checkpoints.spool = BackgroundSpool(
                self.store, self.run, settings.spool, budget=settings.spool_budget,
                say=lambda text: print(f"flor: {text}", file=sys.stderr))
        # TensorBoard events and the best/final summary follow the logs on the writer thread
        self.events = RecordEvents(self.layout.tb_record, lambda: self.meta.epochs_done)
        self.tracker = MetricTracker()
        self.logs = LogWriter(self.layout.record_log, sink=self._follow_logs,
                              on_error=lambda exc, n: self.write_failed("logs", exc))
        self.epoch_started = 0.0
        self.loop_started: float | None = None
        self.epoch_blocks: list[list] = []
        self.due = False  # whether the open block's run is checkpointed (decided at its step_into)
        self._block_times: dict[str, list[float]] = {}  # block -> its run times in run.json (timings.blocks)
        self.saved = False  # whether a block of this epoch was checkpointed: run.json is written at its end
        self.meta_written = 0.0  # when run.json was last written (perf_counter)
        self.meta_due_at = 0.0  # ... and when it is next written after an epoch without a checkpoint
        self._ask_after = 0.0  # the look-ahead's last no (_worker_may_start): when, for which blocks
        self._asked_blocks: list[list] = []
        # the script's state outside end(), one probe per kind (flor.watch); VariablesProbe first: the
        # container and names probes read what it noted
        self.draws = DrawsProbe()  # run.json drew_between: what the code between blocks draws (flor.watch.draws)
        self.watch = Watch([VariablesProbe(), CarriedProbe(), OutsideProbe(), SchedulerProbe(), GeneratorProbe(),
                            ContainerProbe(), NamesProbe(), ModuleAttrProbe(), GradProbe(self._grads_carried),
                            self.draws], self.warn_once)
        self.state_file = StateFile(self.layout.state)  # the loop's variables, changes outside the blocks
        self.loop_state: LoopState | None = None
        self.noted_for: int | None = None  # the epoch before which the loop's variables were last noted
        self.passed = PassedIds()  # given to end() this epoch: the loop state does not name them
        self.meta.process_started = process_started()  # flor replay --plan: the script's startup ...
        self.meta.busy_cores = busy_cores()  # ... and how busy the CPUs were with other work
        self.ranks = RankLink.for_record(settings)  # DDP: the other ranks log beside this run
        if self.ranks is not None:
            self.meta.world_size = self.ranks.world
            self.ranks.agree_run(self.run)
        self.tee_output(self.layout.stdout)
        # files the script writes itself: a replay that writes one again says so (flor.engine.effects)
        self.writes = FileWrites([settings.home, settings.config_dir])
        self.exits = watch_exits(sys._getframe())  # the status of a sys.exit(n) / SystemExit(n) (flor.engine.exits)
        self._install_hooks()

    def write_meta(self, *, durable: bool = False) -> bool:
        """Write run.json (``RunRecord.write``), with the policy's and the probes' figures so far:
        True if written."""
        self.meta_written = time.perf_counter()
        watch = getattr(self, "watch", None)  # the writer thread may write it before they exist
        if watch is not None and hasattr(self, "loop_state"):
            self._observe_watch()
        self.meta.checkpoint_policy = self.checkpoints.policy.describe()
        if watch is not None:
            self.meta.timings["block_vars_s"] = round(watch.seconds, 6)
            self.meta.timings["watch_probes_s"] = {k: round(v, 6) for k, v in
                                                   [*watch.by_probe.items(), ("steady runs", watch.steady_s)]}
        loop = getattr(self, "loop_state", None)
        if loop is not None:
            self.meta.timings["outer_state_s"] = round(loop.seconds, 6)
        written = self.record.write(durable=durable)
        # the next write without a checkpoint: META_EVERY_S after this one began, or 50 times what it took
        took = time.perf_counter() - self.meta_written
        self.meta_due_at = self.meta_written + max(META_EVERY_S, META_WRITE_SHARE * took)
        return written

    def _grads_carried(self, name: str) -> None:
        """Block ``name`` adds to the gradients its previous run left: its checkpoints keep them."""
        if name not in self.meta.grads_carried:
            self.meta.grads_carried.append(name)

    def _follow_logs(self, records: list[dict]) -> None:
        def job() -> None:
            self.tracker.add(records)
            self.events(records)

        self.checkpoints.writer.submit(job, 0, lambda exc: self.warn_once(
            "FL105", None, f"writing TensorBoard events failed ({exc}); the logs are intact"))

    # -- the loop ----------------------------------------------------------------------

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        if self.loop_wrapper is not None:
            self.warn_once("FL209", None, wrapper_advice(self.loop_wrapper))
        try:
            self.meta.epochs_planned = len(iterable)
        except TypeError:
            pass  # a generator: the count is known at the end
        self.loop_started = time.perf_counter()
        self.checkpoints.idle_meter = IdleMeter()
        # the loop's own variables, noted at the end of an epoch a replay worker may start after (flor.watch.loop)
        self.loop_state = LoopState(self.loop_frame, self.state_file) if self.loop_frame is not None else None
        try:
            for epoch, item in enumerate(iterable):
                self.epoch, self.epoch_blocks = epoch, []
                self.mark("epoch", epoch)
                self.epoch_started = time.perf_counter()
                if epoch == 0 and self.loop_state is not None:
                    self.loop_state.start()
                try:
                    yield item
                except GeneratorExit:  # the loop was left: by `break`/`return` (early stopping) or an exception
                    if left_normally(self.loop_frame):
                        self.meta.loop_ended = "break"
                        self.end_epoch(epoch, noted=False)  # its body ran to the end: the epoch counts
                    else:
                        self.meta.loop_ended = "error"
                        self.exits.loop_left_by_exception()  # a SystemExit: its code, while it exists
                    raise
                self.end_epoch(epoch)
            self.meta.loop_ended = "completed"
        finally:
            if self.meta.loop_ended is None:
                self.meta.loop_ended = "error"
            if self.loop_state is not None:
                self.loop_state.close()
            self.mark("after")
            self.end_loop()

    def end_epoch(self, epoch: int, *, noted: bool = True) -> None:
        """The epoch's body ran to its end; ``noted``: the state the next epoch starts from is noted
        (not when the loop is left: there is no next epoch)."""
        if self.open is not None:
            self.close_left_open("at the end of the epoch")
        if noted and self.loop_state is not None and self._worker_may_start(epoch + 1):
            self.loop_state.epoch_end(epoch, self.passed.ids)  # for a replay worker that starts at the next epoch
            self.noted_for = epoch + 1
        self.passed.clear()
        self.meta.epochs_done = epoch + 1
        self.meta.epoch_blocks[str(epoch)] = self.epoch_blocks
        now = time.perf_counter()
        # to the microsecond, as round(x, 6) but ~5x cheaper (a loop of short epochs: every block run)
        self.meta.timings["epoch_s"].append(int((now - self.epoch_started) * 1e6 + 0.5) / 1e6)
        self.logs.flush()
        # after an epoch with a checkpoint (a replay restores from it), else at most every META_EVERY_S: a
        # loop of short epochs (a block per iteration, docs/loops.md) does not pay a file rename each (9 ms
        # here), nor the trackers' and the policy's notes, nor a long run.json's write more than 1/50 of
        # the time; a kill -9 loses at most that much of epochs_done, a normal end writes it all
        if self.saved or now >= self.meta_due_at:
            note_trackers(self.meta, self.loop_frame, self.settings.config_dir)
            self.write_meta()
        self.saved = False
        if self.spool is not None:
            try:
                self.spool.sync()
            except Exception as exc:  # noqa: BLE001 - uploads never stop training
                self.write_failed("spool", exc)

    def _worker_may_start(self, epoch: int) -> bool:
        """Whether a replay worker may start at ``epoch``: one starts at epoch 0 or at an epoch whose
        blocks are all checkpointed (``flor.plan.init_start``), so the loop's variables are noted
        only before an epoch that may be (``CheckpointPolicy.may_be_due``): a loop of short epochs (a
        block per iteration, docs/loops.md) does not encode them at every one. A block is checkpointed
        only at an epoch they were noted before (``step_into``)."""
        planned = self.meta.epochs_planned
        if planned is not None and epoch >= planned:
            return False  # the loop ends: no epoch to start at
        policy = self.checkpoints.policy
        if policy.every is not None:  # a fixed schedule: what the blocks ran and when does not matter
            return policy.may_be_due((), epoch, elapsed=0.0)
        now = time.perf_counter()
        if now < self._ask_after and self.epoch_blocks == self._asked_blocks:
            return False  # it said no under LOOKAHEAD_EVERY_S ago, for the same blocks
        names, times = [name for name, _ in self.epoch_blocks], self._block_times  # their run times, by block
        run_s = {name: times[name][-1] for name in names if times.get(name)}
        elapsed = now - (self.loop_started or self.block_started) + max(run_s.values(), default=0.0)
        may = policy.may_be_due(names, epoch, elapsed=elapsed, run_s=run_s)
        if not may:
            self._ask_after, self._asked_blocks = now + LOOKAHEAD_EVERY_S, self.epoch_blocks
        return may

    # -- blocks ------------------------------------------------------------------------

    def step_into(self, name: str, probed: bool) -> bool:
        _, epoch, occ = self.open_block(name)
        # decided now, as the block starts: a checkpoint's run notes what the block changes outside
        # end() (flor.watch), which a run without one does not need (a replay re-executes it)
        if epoch and self.loop_state is not None and self.noted_for != epoch:
            # a worker starting here would lack the loop's variables: not due, without asking the policy
            self.due = False
            self.checkpoints.policy.refused(epoch)
        else:
            last = self._block_times.get(name)
            training_s = time.perf_counter() - (self.loop_started or self.block_started) + (last[-1] if last else 0.0)
            self._observe_watch()
            self.due = self.checkpoints.policy.due(name, epoch, elapsed=training_s, run_s=last[-1] if last else None)
        # what the block starts from; a steady run (a quiet one of a block that ended twice) needs no frame
        if self.due or not self.watch.steady_enter(name, epoch, occ):
            self.watch.enter(name, epoch, occ, caller_frame(), note=self.due)
        if self.due:  # the RNG state it starts from goes into its checkpoint only
            self.checkpoints.block_started()
        return True

    def _observe_watch(self) -> None:
        """Charge the probes' time and the loop's noting; all but the block variables' noting
        (``VariablesProbe``, done for checkpointed runs only) and the loop's (before epochs that may be
        checkpointed) is paid at every block run or epoch."""
        loop = self.loop_state.seconds if self.loop_state else 0.0
        noting = self.watch.by_probe.get(VariablesProbe.__name__, 0.0)
        self.checkpoints.policy.observe_watch(self.watch.seconds + loop, fixed=self.watch.seconds - noting)

    def left_open(self, key: tuple[str, int | None, int]) -> None:
        name, epoch, occ = key
        self.watch.drop()
        if epoch is None:
            self.meta.outside_blocks.append([name, occ])
        else:  # listed, so a replay expects the block there; without a manifest it re-executes the epoch
            self.epoch_blocks.append([name, occ])
        self.record.checkpoint_failed(name, epoch, f"{LEFT_OPEN}: an exception or `continue` skipped SkipBlock.end; "
                                      "not checkpointed", occ)

    def end(self, objs: tuple) -> Any:
        name, epoch, occ = self.close_block()
        elapsed = time.perf_counter() - self.block_started
        noted = self.watch.steady_leave(objs)  # a steady run: only what acts there (Watch.steady_enter)
        if noted is None:
            noted, _ = self.watch.leave(caller_frame(), objs)  # kept in the checkpoint: a restore sets them
        outside = noted.pop("outside", None) if noted else None
        carried = noted.pop("carried", None) if noted else None  # tensors: beside the objects, not in "watch"
        if outside:  # in-place changes since the last end(), compared by a replay at every block run
            self.state_file.write(epoch, {"block": name, "occ": occ, "outside": outside})
        self.passed.add(objs)  # outer-loop state: these are checkpointed, not named
        if epoch is None:
            self.meta.outside_blocks.append([name, occ])
        else:
            self.epoch_blocks.append([name, occ])
        times = self._block_times.get(name)
        if times is None:
            times = self._block_times[name] = self.meta.timings["blocks"].setdefault(name, [])
        times.append(int(elapsed * 1e6 + 0.5) / 1e6)  # to the microsecond, as in end_epoch
        if self.ranks is not None:  # every rank fingerprints the same blocks; rank 0 notes who differs
            self.ranks.check(name, epoch, objs, self.meta)
        if self.due:
            self.saved = True
            self.checkpoints.checkpoint(name, epoch, occ, objs, elapsed, noted, carried)
        return as_result(objs)

    def settle(self) -> None:
        """A signal goes to the script's own handler next: flush within FLOR_FLUSH_TIMEOUT, write run.json."""
        self.logs.flush()
        self.flush_marks()
        self.checkpoints.writer.flush(self.settings.flush_timeout)
        self.meta.status = "terminated"
        self.meta.error = getattr(self, "terminated_by", None)
        self.write_meta(durable=True)

    # -- logs and exit -----------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.close_left_open("at exit")
        if self.ranks is not None:
            self.ranks.release()
        if self.loop == "in" and self.epoch is not None and self.exit_error is None:
            # the script ended inside the loop without an error: it left the loop (a `break` on a
            # loop object it still holds, or sys.exit) after the body of this epoch ran
            self.meta.loop_ended = "break"
            self.end_epoch(self.epoch, noted=False)
        self.mark("end")
        note_trackers(self.meta, self.loop_frame, self.settings.config_dir)  # a run started after the loop, no loop
        self.state_file.close()
        left: list = []
        cp = self.checkpoints
        try:
            self.logs.flush()
            left = cp.writer.close(timeout=self.settings.flush_timeout)  # bounded, also on SIGTERM
            for block, epoch in left:  # abandoned whole: their manifests are never written
                cp.skipped(block, epoch, "exit flush timed out")
            if left:
                print(f"flor: FL114 abandoned {len(left)} checkpoint(s) still being written "
                      f"{self.settings.flush_timeout:g} s after the run ended (FLOR_FLUSH_TIMEOUT); "
                      "a replay re-executes those epochs (run.json: checkpoint_skipped)", file=sys.stderr)
            try:
                self.events.close()
            except OSError as exc:  # events a full disk refused are still buffered and fail again here
                self.warn_once("FL105", None, f"writing TensorBoard events failed ({exc}); the logs are intact")
        except Exception:  # noqa: BLE001 - report, then still write the final status
            traceback.print_exc()
        self.meta.metrics = self.tracker.summary()
        policy = cp.policy
        self.meta.checkpoint_policy = policy.describe()
        self.meta.background = {"cpu_s": round(cp.background_cpu_s, 6), "bytes_written": cp.bytes_written}
        line = per_run = ""
        watch = getattr(self, "watch", None)
        steady = watch.steady_runs if watch is not None else 0
        if policy.checkpointed or policy.skipped or steady:  # blocks ran: the loop or a block started the clock
            training_s = time.perf_counter() - (self.loop_started or self.block_started)
            if watch is not None and steady:  # FL122: the checks of runs without a checkpoint alone over the budget
                per_run = policy.per_run_note(watch.steady_run_s, steady, training_s) or ""
            if policy.checkpointed or policy.skipped:  # which epochs, at what cost, charged how
                failed_at = frozenset(f.get("epoch") for f in self.meta.checkpoint_failures) | {e for _, e in left}
                line = policy.exit_line(training_s, failed_at)
        ended = self.exits.outcome() if self.exit_error is None else None
        self.exits.uninstall()
        self.writes.close()
        if self.writes.paths:
            self.meta.extra["files_written"] = list(self.writes.paths)
        self.meta.extra["drew_between"] = self.draws.noted()
        self.record.finish(self.exit_error, getattr(self, "terminated_by", None), ended)
        if failures := self.record.failures_line(self.write_failures):
            print(failures, file=sys.stderr)
        try:
            self.untee_output()
        finally:
            written = self.write_meta(durable=True)  # last, so it counts a failure to save the output log too
            self.record.release_reserved()
        if not written:  # what a replay and `flor ls` will read is the last run.json that was written
            print(self.record.unwritten_line(self.run_dir), file=sys.stderr)
        if line:  # after the tee: the run's stdout.log holds what the script printed, not this
            print(line, file=sys.stderr)
        if per_run:
            print(f"flor: {per_run}", file=sys.stderr)
        if self.spool is not None:  # after the tee: stdout.log is complete and goes up too
            wait = self.settings.spool_wait
            self.spool.finish(min(wait, self.settings.flush_timeout) if self.exit_error == "terminated" else wait)

