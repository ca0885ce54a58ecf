"""Recording: run metadata, logs, stdout and a checkpoint of every block at every epoch."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

from .. import hparams
from .ddp import RankLink
from ..logs import LogWriter
from ..logs.summary import MetricTracker
from ..logs.tensorboard import RecordEvents
from ..placement import IdleMeter
from ..policy import CheckpointPolicy
from ..redact import redact_argv
from ..runinfo import busy_cores, git_info, gpus, process_started, script_info, versions
from ..source.blocks import wrapper_advice
from ..watch.attributes import warn_module_attrs, watch_module_attrs
from ..watch.frames import caller_frame, left_normally
from ..watch.grads import CarriedGrad, grad_probe
from ..watch.loop import LoopFrame, OuterStateWriter
from ..watch.names import block_site, stale_at_end, unbound_given, warn_bindings
from ..watch.outside import OutsideChanges
from ..watch.reachable import (
    drawn_generators, grown_containers, warn_containers, warn_forgotten, warn_generators, watch_containers,
    watch_generators,
)
from ..watch.variables import BlockVars, warn_unnoted
from .exits import watch_exits
from .checkpointing import Checkpointing
from .session import Session, as_result, copy_source, new_run_id
from ..settings import Settings
from ..state import capture_rng
from ..store import BackgroundWriter
from ..store.layout import RunLayout
from ..store.runmeta import RunMeta
from ..store.experiment import dumps

__all__ = ["RecordSession"]

#: disk set aside for the final run.json, the first size that fits: on a disk that fills during
#: the run, its end, its epochs and its failures are still recorded (a replay reads them)
#: how a block closed without its end() begins its checkpoint_failures entry: the script's own
#: exception or `continue`, not a checkpoint that failed (the exit line counts only those)
LEFT_OPEN = "left open"
RUN_JSON_RESERVE = (1 << 20, 1 << 18, 1 << 16, 1 << 14)


class RecordSession(Checkpointing, Session):
    mode = "record"

    def __init__(self, settings: Settings) -> None:
        import torch

        super().__init__(settings)
        self.run = new_run_id()
        self.run_dir = self.store.run_path(self.run)
        self.run_dir.mkdir(parents=True)
        self.layout = RunLayout(self.run_dir)
        script = script_info(sys.argv[0] if sys.argv else "")
        git, diff = git_info(script["script"], exclude=[settings.home])
        self.meta = RunMeta(
            name=settings.name or "", run=self.run, pid=os.getpid(), argv=redact_argv(list(sys.argv)),
            cwd=os.getcwd(), script=script["script"], script_sha256=script["script_sha256"], git=git,
            versions=versions(), torch_threads=torch.get_num_threads(), started=self.started,
            hyperparameters=hparams.captured(), write_failures=self.write_failures,
        )
        # reentrant: a signal handler may run while it is held; the writer thread notes failures in meta
        self._meta_lock = threading.RLock()
        self.meta_written: tuple[str, int] | None = None  # (status, epochs_done) of the last run.json written
        self.reserved: Path | None = None
        if self.write_meta():  # disk set aside for the final run.json, should the disk fill meanwhile
            self.reserved = self.store.backend.reserve(self.store.run_key(self.run, "run.json"), RUN_JSON_RESERVE)
        hparams.subscribe(self._hyperparameters)
        try:
            copy_source(script["script"], self.layout.source)
            if diff:
                self.layout.diff_patch.write_text(diff)
        except OSError as exc:
            self.write_failed("source", exc)
        self.writer = BackgroundWriter(budget=settings.writer_memory)  # never blocks training; see writer.py
        self.snapshot_bytes: dict[str, int] = {}  # per block: the size of its last snapshot
        # temp files of writers that died mid-write (a kill, a crash) take space: clear them off the training thread
        self.writer.submit(self.store.remove_stale_tmp, 0, lambda exc: None)
        self.writer.submit(self._gpus, 0, lambda exc: None)
        self.spool = None
        if settings.spool:  # uploads run on their own thread: training never waits on the network
            from ..store.sync import BackgroundSpool

            self.meta.spool = settings.spool
            from ..store.trust import remember_spool  # its replay may fetch evicted blobs from it
            remember_spool(settings.config_dir, settings.spool)
            self.spool = BackgroundSpool(self.store, self.run, settings.spool, budget=settings.spool_budget,
                                         say=lambda text: print(f"flor: {text}", file=sys.stderr))
        # TensorBoard events and the best/final summary follow the logs on the writer thread
        self.events = RecordEvents(self.layout.tb_record, lambda: self.meta.epochs_done)
        self.tracker = MetricTracker()
        self.logs = LogWriter(self.layout.record_log, sink=self._follow_logs,
                              on_error=lambda exc, n: self.write_failed("logs", exc))
        self.epoch_started = 0.0
        self.loop_started: float | None = None
        self.policy = CheckpointPolicy(overhead=settings.overhead, every=settings.every)
        self.pool: Any = None  # snapshot buffers and where small leaves went (flor.state), on first use
        self.packs: Any = None
        self.trees: dict[str, Any] = {}  # block name -> flor.state.TreeCache
        self.last_rng: dict[str, tuple] = {}  # block name -> its last checkpoint's RNG capture, stored tree and text
        self.background_cpu_s = 0.0
        self.background_seen = 0.0  # background_cpu_s at the last idle-core reading
        self.idle_meter = IdleMeter()  # restarted when the loop starts
        self.charge_read = False  # whether the writer has chosen the charge (flor.policy) yet
        self.off_cpu = threading.local()  # .meter: each training thread's OffCpu (a new thread, a new clock)
        self.bytes_written = 0
        self.epoch_blocks: list[list] = []
        self.ends_checked: set[str] = set()  # blocks whose end() arguments were checked
        self.generators_watched: dict[str, list] = {}  # block -> its first entry's generators (flor.watch.reachable)
        self.containers_watched: dict[str, list] = {}  # block -> its first entry's lists, dicts (flor.watch.reachable)
        self.generators_drawn: dict[str, list] = {}  # block -> those its first run drew from, not given to end()
        self.sites: dict[str, Any] = {}  # block -> where its first entry was, the names bound (flor.watch.names)
        self.module_attrs: dict[str, dict] = {}  # block -> its first entry's module attributes (ditto)
        self.grad_probes: dict[str, Any] = {}  # block -> a parameter whose gradient its second run may carry over
        self.carried_grad: CarriedGrad | None = None
        self.outside, self.outside_found = OutsideChanges(), {}  # tensors code between blocks changed
        self.block_vars, self.block_vars_s = BlockVars(), 0.0  # the plain variables each block changes, noted at its end()
        self.block_state = OuterStateWriter(self.layout.block_state, "the variables a block changes")
        self.passed_ids: set[int] = set()
        self.meta.process_started = process_started()  # flor replay --plan: the script's startup ...
        self.meta.busy_cores = busy_cores()  # ... and how busy the CPUs were with other work
        self.ranks = RankLink.for_record(settings)  # DDP: the other ranks log beside this run
        if self.ranks is not None:
            self.meta.world_size = self.ranks.world
            self.ranks.agree_run(self.run)
        self.tee_output(self.layout.stdout)
        self.exits = watch_exits(sys._getframe())  # the status of a sys.exit(n) / SystemExit(n) (flor.engine.exits)
        self._install_hooks()

    def write_meta(self, *, durable: bool = False) -> bool:
        """Write run.json; a failure (a full disk) is counted, never raised: True if written."""
        try:
            with self._meta_lock:
                body = dumps(self.meta.to_json())
                seen = (self.meta.status, self.meta.epochs_done)
            self.store.backend.write(self.store.run_key(self.run, "run.json"), body, durable=durable)
            self.meta_written = seen  # what readers will see
            return True
        except Exception as exc:  # noqa: BLE001 - training never stops because run.json cannot be written
            if durable and self.release_reserved():  # the disk filled: the space set aside is for this write
                return self.write_meta(durable=True)
            self.write_failed("run.json", exc)
            return False

    def release_reserved(self) -> bool:
        """Give back the disk set aside for the final run.json; True if there was some."""
        reserved, self.reserved = self.reserved, None
        if reserved is None:
            return False
        try:
            reserved.unlink()
        except OSError:
            return False
        return True

    def _gpus(self) -> None:
        """The GPUs into run.json's versions, on the writer (``flor.runinfo.gpus``)."""
        found = gpus()
        if found:
            with self._meta_lock:
                self.meta.versions = {**self.meta.versions, **found}
            if not self._closed:
                self.write_meta()

    def _hyperparameters(self, values: dict[str, Any]) -> None:
        """argparse or flor.arg gave more hyperparameters after the run started."""
        self.meta.hyperparameters = values
        if not self._closed:
            self.write_meta()

    def _follow_logs(self, records: list[dict]) -> None:
        def job() -> None:
            self.tracker.add(records)
            self.events(records)

        self.writer.submit(job, 0, lambda exc: self.warn_once(
            ("tensorboard",), f"writing TensorBoard events failed ({exc}); the logs are intact"))

    # -- the loop ----------------------------------------------------------------------

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        if self.loop_wrapper is not None:
            self.warn_once(("wrapper",), wrapper_advice(self.loop_wrapper))
        try:
            self.meta.epochs_planned = len(iterable)
        except TypeError:
            pass  # a generator: the count is known at the end
        self.loop_started = time.perf_counter()
        self.idle_meter = IdleMeter()
        outer = self._outer_state()
        try:
            for epoch, item in enumerate(iterable):
                self.epoch, self.epoch_blocks = epoch, []
                self.mark("epoch", epoch)
                self.epoch_started = time.perf_counter()
                if epoch == 0 and outer is not None:
                    outer[0].start()
                try:
                    yield item
                except GeneratorExit:  # the loop was left: by `break`/`return` (early stopping) or an exception
                    if left_normally(self.loop_frame):
                        self.meta.loop_ended = "break"
                        self.end_epoch(epoch)  # its body ran to the end: the epoch counts
                    else:
                        self.meta.loop_ended = "error"
                        self.exits.loop_left_by_exception()  # a SystemExit: its code, while it exists
                    raise
                self.end_epoch(epoch, outer)
            self.meta.loop_ended = "completed"
        finally:
            if self.meta.loop_ended is None:
                self.meta.loop_ended = "error"
            if outer is not None:
                outer[0].close()
                outer[1].close()
            self.mark("after")
            self.end_loop()

    def _outer_state(self) -> tuple[LoopFrame, OuterStateWriter] | None:
        """The loop's frame and where its plain-data variables go at each epoch's end (see
        ``flor.watch.loop``); None when flor.it was not called from a Python frame."""
        if self.loop_frame is None:
            return None
        return LoopFrame(self.loop_frame), OuterStateWriter(self.layout.outer_state)

    def end_epoch(self, epoch: int, outer: tuple[LoopFrame, OuterStateWriter] | None = None) -> None:
        self.close_left_open("at the end of the epoch")
        if outer is not None:  # the state the next epoch starts from, for a replay worker that starts there
            t0 = time.perf_counter()
            try:
                state = outer[0].capture(self.passed_ids)
            except Exception as exc:  # noqa: BLE001 - never stops training; a replay names what is missing
                state = {"vars": {}, "unrestorable": [], "error": repr(exc)}
            outer[1].write(epoch, state)
            self.passed_ids.clear()
            self.meta.timings["outer_state_s"] = round(self.meta.timings.get("outer_state_s", 0.0)
                                                       + time.perf_counter() - t0, 6)
        self.meta.epochs_done = epoch + 1
        self.meta.epoch_blocks[str(epoch)] = self.epoch_blocks
        self.meta.timings["epoch_s"].append(round(time.perf_counter() - self.epoch_started, 6))
        self.logs.flush()
        self.meta.checkpoint_policy = self.policy.describe()
        self.write_meta()
        if self.spool is not None:
            try:
                self.spool.sync()
            except Exception as exc:  # noqa: BLE001 - uploads never stop training
                self.write_failed("spool", exc)

    # -- blocks ------------------------------------------------------------------------

    def step_into(self, name: str, probed: bool) -> bool:
        self.open_block(name)
        frame = caller_frame()
        t0 = time.perf_counter()
        self.block_vars.enter(name, frame)  # what the block changes outside end(): noted at its end
        self.outside_found[name] = self.outside.started()  # ... and what the code since its last end() did
        self.block_vars_s += time.perf_counter() - t0
        if name not in self.ends_checked:  # its first time: which of the script's own generators does it draw from?
            self.generators_watched[name] = watch_generators(frame)
            self.containers_watched[name] = watch_containers(frame)
            self.sites[name] = block_site(frame)
            self.module_attrs[name] = watch_module_attrs(frame)
        else:  # its second: does it draw on from where its first run left a generator, or a gradient?
            if name in self.generators_drawn:
                warn_generators(name, self.generators_drawn.pop(name))
            param = self.grad_probes.pop(name, None)
            if param is not None:
                self.carried_grad = CarriedGrad(name, param)
        # the RNG state the block starts from: a replay that re-executes the block starts it
        # from here too, even when the script never seeded Python's or NumPy's generator
        t0 = time.perf_counter()
        self.rng_start = capture_rng(raw=True)  # for snapshot_rng only: raw bytes where it can
        self.meta.timings.setdefault("start_s", []).append(round(time.perf_counter() - t0, 6))  # fixed cost too
        return True

    def left_open(self, key: tuple[str, int | None, int]) -> None:
        name, epoch, occ = key
        if epoch is None:
            self.meta.outside_blocks.append([name, occ])
        else:  # listed, so a replay expects the block there; without a manifest it re-executes the epoch
            self.epoch_blocks.append([name, occ])
        with self._meta_lock:
            self.meta.checkpoint_failures.append({
                "block": name, "epoch": epoch, "occurrence": occ,
                "error": f"{LEFT_OPEN}: an exception or `continue` skipped SkipBlock.end; not checkpointed"})

    def end(self, objs: tuple) -> Any:
        name, epoch, occ = self.close_block()
        elapsed = time.perf_counter() - self.block_started
        t0 = time.perf_counter()
        changed, more, lost = self.block_vars.leave(name, objs)
        outside = self.outside_found.pop(name, {})
        if changed or more or outside:  # a replay that restores the block sets them as they are now
            self.block_state.write(epoch, {"block": name, "occ": occ, "vars": changed, **more,
                                           **({"outside": outside} if outside else {})})
        self.outside.ended(objs)
        if lost:
            warn_unnoted(name, epoch, lost)
        self.block_vars_s += time.perf_counter() - t0
        self.meta.timings["block_vars_s"] = round(self.block_vars_s, 6)
        if name not in self.ends_checked:  # once a block: an optimizer's scheduler or scaler left out?
            self.ends_checked.add(name)
            warn_forgotten(name, objs)
            self.generators_drawn[name] = drawn_generators(self.generators_watched.pop(name, []), objs)
            grown = grown_containers(self.containers_watched.pop(name, []), objs)
            warn_containers(name, [g for g in grown if g[0] not in changed])  # those noted are restored
            site, frame = self.sites.pop(name, None), caller_frame()
            named = set(changed) | set(more.get("globals", ())) | {var for var, _ in lost}  # restored, or warned about
            stale = [var for var in stale_at_end(site, frame) if var not in named]
            warn_bindings(name, stale, unbound_given(site, frame, objs))
            warn_module_attrs(name, self.module_attrs.pop(name, {}), frame, objs)
            self.grad_probes[name] = grad_probe(objs)
        if self.carried_grad is not None:  # its second run: did it add to the gradients the first left?
            if self.carried_grad.close() and name not in self.meta.grads_carried:
                self.meta.grads_carried.append(name)
            self.carried_grad = None
        self.passed_ids.update(id(o) for o in objs)  # outer-loop state: these are checkpointed, not named
        if epoch is None:
            self.meta.outside_blocks.append([name, occ])
        else:
            self.epoch_blocks.append([name, occ])
        self.meta.timings["blocks"].setdefault(name, []).append(round(elapsed, 6))
        if self.ranks is not None:  # every rank fingerprints the same blocks; rank 0 notes who differs
            self.ranks.check(name, epoch, objs, self.meta)
        training_s = time.perf_counter() - (self.loop_started or self.block_started)
        if self.policy.due(name, epoch, elapsed=training_s):
            self.checkpoint(name, epoch, occ, objs, elapsed)
        return as_result(objs)

    def _skipped(self, name: str, epoch: int | None, reason: str) -> None:
        """A checkpoint not taken (the writer is behind) or abandoned (the exit flush timed out)."""
        with self._meta_lock:
            self.meta.checkpoint_skipped.append({"epoch": epoch, "block": name, "reason": reason})
        if reason == "writer behind":
            self.warn_once(("writer behind",), (
                f"the background writer is behind ({self.writer.pending_bytes / 2**20:.0f} MiB of checkpoints queued, "
                f"the limit is {self.writer.budget / 2**20:.0f} MiB, FLOR_WRITER_MEMORY): checkpoint of block {name!r} "
                f"at epoch {epoch} skipped rather than making training wait; replay re-executes such epochs "
                "(run.json: checkpoint_skipped)"))

    def settle(self) -> None:
        """A signal goes to the script's own handler next: flush within FLOR_FLUSH_TIMEOUT, write run.json."""
        self.logs.flush()
        self.writer.flush(self.settings.flush_timeout)
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
            self.end_epoch(self.epoch)
        self.mark("end")
        self.block_state.close()
        left: list = []
        try:
            self.logs.flush()
            left = self.writer.close(timeout=self.settings.flush_timeout)  # bounded, also on SIGTERM
            for block, epoch in left:  # abandoned whole: their manifests are never written
                self._skipped(block, epoch, "exit flush timed out")
            if left:
                print(f"flor: abandoned {len(left)} checkpoint(s) still being written "
                      f"{self.settings.flush_timeout:g} s after the run ended (FLOR_FLUSH_TIMEOUT); "
                      "a replay re-executes those epochs (run.json: checkpoint_skipped)", file=sys.stderr)
            try:
                self.events.close()
            except OSError as exc:  # events a full disk refused are still buffered and fail again here
                self.warn_once(("tensorboard",), f"writing TensorBoard events failed ({exc}); the logs are intact")
        except Exception:  # noqa: BLE001 - report, then still write the final status
            traceback.print_exc()
        self.meta.metrics = self.tracker.summary()
        self.meta.checkpoint_policy = self.policy.describe()
        self.meta.background = {"cpu_s": round(self.background_cpu_s, 6), "bytes_written": self.bytes_written}
        if self.policy.checkpointed or self.policy.skipped:  # which epochs, at what cost, charged how
            training_s = time.perf_counter() - (self.loop_started or self.block_started)
            failed = frozenset(f.get("epoch") for f in self.meta.checkpoint_failures) | {e for _, e in left}
            line = f"flor: {self.policy.summary(training_s, failed)}"
            if self.policy.skipped:
                line += "; a replay re-executes the others from the nearest checkpoint"
        else:
            line = ""
        self.meta.status = {None: "finished", "interrupted": "interrupted",
                            "terminated": "terminated"}.get(self.exit_error, "crashed")
        if self.exit_error not in (None, "interrupted"):  # terminated: the signal's name
            self.meta.error = getattr(self, "terminated_by", None) or self.exit_error
        ended = self.exits.outcome() if self.exit_error is None else None
        self.exits.uninstall()
        if ended is not None:  # sys.exit(n) / SystemExit(n): crashed unless n is 0 or None
            self.meta.status, self.meta.exit_code, message = ended
            self.meta.error = message or self.meta.error
        self.meta.ended = time.time()
        # a block left open (an exception past its end(): the script's, already reported) is not
        # a checkpoint that failed, and a run that crashed was affected: said by its warning only
        failed = sum(1 for f in self.meta.checkpoint_failures if not str(f.get("error", "")).startswith(LEFT_OPEN))
        if failed or self.write_failures:
            counts = ", ".join(f"{kind} {n}" for kind, n in sorted(self.write_failures.items()))
            print(f"flor: {failed} checkpoint(s) failed" + (f" and writes failed ({counts})" if counts else "")
                  + "; training was not affected, a replay re-executes the epochs without a checkpoint"
                  + " (run.json: checkpoint_failures, write_failures)", file=sys.stderr)
        try:
            self.untee_output()
        finally:
            written = self.write_meta(durable=True)  # last, so it counts a failure to save the output log too
            self.release_reserved()
        if not written:  # what a replay and `flor ls` will read is the last run.json that was written
            last = self.meta_written
            print("flor: the final run.json could not be written, so the run's end, checkpoint_failures and "
                  "write_failures are not recorded: " + (
                      f"the last one written says {last[0]!r} with {last[1]} epoch(s) done, and a replay covers "
                      "only those" if last else "none was ever written, so `flor ls` and replay cannot see this run")
                  + f" ({self.run_dir})", file=sys.stderr)
        if line:  # after the tee: the run's stdout.log holds what the script printed, not this
            print(line, file=sys.stderr)
        if self.spool is not None:  # after the tee: stdout.log is complete and goes up too
            wait = self.settings.spool_wait
            self.spool.finish(min(wait, self.settings.flush_timeout) if self.exit_error == "terminated" else wait)

