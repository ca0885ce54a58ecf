"""Recording: run metadata, logs, stdout and a checkpoint of every block at every epoch."""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Iterator

from .. import hparams
from .ddp import RankLink
from ..errors import warn
from ..logs import LogWriter
from ..logs.summary import MetricTracker
from ..logs.tensorboard import RecordEvents
from ..placement import cores
from ..policy import CheckpointPolicy
from ..runinfo import busy_cores, git_info, process_started, redact_argv, script_info, versions
from .session import Session, as_result, copy_source, new_run_id
from ..settings import Settings
from ..store import BackgroundWriter
from ..store.layout import RunLayout
from ..store.runmeta import RunMeta
from ..store.experiment import dumps

__all__ = ["RecordSession"]


class RecordSession(Session):
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
            hyperparameters=hparams.captured(),
        )
        self.write_meta()
        hparams.subscribe(self._hyperparameters)
        copy_source(script["script"], self.layout.source)
        if diff:
            self.layout.diff_patch.write_text(diff)
        self.writer = BackgroundWriter()
        self.spool = None
        if settings.spool:  # uploads run on their own thread: training never waits on the network
            from ..store.sync import BackgroundSpool

            self.meta.spool = settings.spool
            self.spool = BackgroundSpool(self.store, self.run, settings.spool, budget=settings.spool_budget,
                                         say=lambda text: print(f"flor: {text}", file=sys.stderr))
        # TensorBoard events and the best/final summary follow the logs on the writer thread
        self.events = RecordEvents(self.layout.tb_record, lambda: self.meta.epochs_done)
        self.tracker = MetricTracker()
        self.logs = LogWriter(self.layout.record_log, sink=self._follow_logs)
        self.epoch_started = 0.0
        self.loop_started: float | None = None
        self.policy = CheckpointPolicy(overhead=settings.overhead, every=settings.every)
        self.pool: Any = None
        self.background_cpu_s = 0.0
        self.bytes_written = 0
        self.epoch_blocks: list[list] = []
        self.meta.process_started = process_started()  # flor replay --plan: the script's startup ...
        self.meta.busy_cores = busy_cores()  # ... and how busy the CPUs were with other work
        self.ranks = RankLink.for_record(settings.name or "")  # DDP: the other ranks log beside this run
        if self.ranks is not None:
            self.meta.world_size = self.ranks.world
            self.ranks.agree_run(self.run)
        self.tee_output(self.layout.stdout)
        self._install_hooks()

    def write_meta(self, *, durable: bool = False) -> None:
        self.store.write_json(self.store.run_key(self.run, "run.json"), self.meta.to_json(), durable=durable)

    def _hyperparameters(self, values: dict[str, Any]) -> None:
        """argparse or flor.arg gave more hyperparameters after the run started."""
        self.meta.hyperparameters = values
        if not self._closed:
            self.write_meta()

    def _follow_logs(self, records: list[dict]) -> None:
        def job() -> None:
            self.tracker.add(records)
            self.events(records)

        self.writer.submit(job, 0, lambda exc: warn(f"writing TensorBoard events failed ({exc}); the logs are intact"))

    # -- the loop ----------------------------------------------------------------------

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        try:
            self.meta.epochs_planned = len(iterable)
        except TypeError:
            pass  # a generator: the count is known at the end
        self.loop_started = time.perf_counter()
        try:
            for epoch, item in enumerate(iterable):
                self.epoch, self.epoch_blocks = epoch, []
                self.mark("epoch", epoch)
                self.epoch_started = time.perf_counter()
                yield item
                self.end_epoch(epoch)
        finally:
            self.mark("after")
            self.end_loop()

    def end_epoch(self, epoch: int) -> None:
        self.meta.epochs_done = epoch + 1
        self.meta.epoch_blocks[str(epoch)] = self.epoch_blocks
        self.meta.timings["epoch_s"].append(round(time.perf_counter() - self.epoch_started, 6))
        self.logs.flush()
        self.meta.checkpoint_policy = self.policy.describe()
        self.write_meta()
        if self.spool is not None:
            self.spool.sync()

    # -- blocks ------------------------------------------------------------------------

    def step_into(self, name: str, probed: bool) -> bool:
        from ..state import capture_rng

        self.open_block(name)
        # the RNG state the block starts from: a replay that re-executes the block starts it
        # from here too, even when the script never seeded Python's or NumPy's generator
        self.rng_start = capture_rng()
        return True

    def end(self, objs: tuple) -> Any:
        name, epoch, occ = self.close_block()
        elapsed = time.perf_counter() - self.block_started
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

    def checkpoint(self, name: str, epoch: int | None, occ: int, objs: tuple, elapsed: float) -> None:
        from ..state import BufferPool, capture_rng, snapshot

        if self.pool is None:
            self.pool = BufferPool()
        t0 = time.perf_counter()
        try:
            objects = snapshot(list(objs), pool=self.pool)
            rng = snapshot(capture_rng())
            rng_start = snapshot(self.rng_start)
        except Exception as exc:  # noqa: BLE001 - an object flor cannot capture must not stop training
            self._failed(name, epoch, exc)
            return
        snap_s = time.perf_counter() - t0
        manifest_key = self.store.manifest_key(self.run, name, epoch, occ)
        nbytes = objects.nbytes + rng.nbytes
        on_gpu = objects.ready is not None  # the snapshot copied from a CUDA device

        def job() -> None:
            cpu0 = time.thread_time()
            written: list[int] = [0]
            dirs: set[str] = set()

            def put(data: Any, digest: str) -> None:
                _, new = self.store.blobs.put(data, digest)
                if new:
                    written[0] += len(data)
                    dirs.add(f"objects/{digest[:2]}")

            tree = objects.materialize(put)
            rng_tree = rng.materialize(put)
            rng_start_tree = rng_start.materialize(put)
            for d in dirs:  # the blobs' renames are durable before the manifest names them
                self.store.backend.sync_dir(d)
            body = {"objects": tree, "rng": rng_tree}
            manifest = {
                "format": 1, "block": name, "epoch": epoch, "occurrence": occ, "count": len(objs),
                **body, "rng_start": rng_start_tree, "digest": _digest(body), "bytes": nbytes, "new_bytes": written[0],
                "block_s": round(elapsed, 6), "snapshot_s": round(snap_s, 6), "created": time.time(),
            }
            self.store.write_json(manifest_key, manifest)
            if self.spool is not None:  # queued only now: a manifest goes up after its blobs
                self.spool.checkpoint(manifest_key)
            cpu = time.thread_time() - cpu0
            self.background_cpu_s += cpu
            self.bytes_written += written[0]
            if not on_gpu:  # training on the CPU shares the cores with this thread
                self.policy.observe_background(name, cpu / cores())

        self.writer.submit(job, nbytes, lambda exc: self._failed(name, epoch, exc))
        stall = time.perf_counter() - t0  # the snapshot, plus any wait for the memory budget
        self.policy.observe(name, epoch, stall=stall)
        self.meta.timings.setdefault("stall_s", []).append(round(stall, 6))

    def _failed(self, name: str, epoch: int | None, exc: BaseException) -> None:
        self.meta.checkpoint_failures.append({"block": name, "epoch": epoch, "error": repr(exc)})
        warn(f"checkpoint of block {name!r} at epoch {epoch} failed ({exc}); training goes on "
             "and a replay will re-execute that epoch")

    # -- logs and exit -----------------------------------------------------------------

    def write_log(self, name: str, value: Any, step: Any) -> None:
        self.logs.add(name, value, self.epoch, step, self.open[0] if self.open else None, self.where())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.mark("end")
        try:
            self.logs.flush()
            self.writer.close()
            self.events.close()
        except Exception:  # noqa: BLE001 - report, then still write the final status
            traceback.print_exc()
        self.meta.metrics = self.tracker.summary()
        self.meta.checkpoint_policy = self.policy.describe()
        self.meta.background = {"cpu_s": round(self.background_cpu_s, 6), "bytes_written": self.bytes_written}
        if self.policy.skipped:
            done = len(self.policy.checkpointed)
            print(f"flor: checkpointed {done} of {done + len(self.policy.skipped)} epochs to keep the training "
                  f"thread's checkpoint stall within {self.policy.overhead:.1%} of training time "
                  f"(--flor_overhead); replay re-executes the others from the nearest checkpoint", file=sys.stderr)
        self.meta.status = "finished" if self.exit_error is None else (
            "interrupted" if self.exit_error == "interrupted" else "crashed")
        if self.exit_error not in (None, "interrupted"):
            self.meta.error = self.exit_error
        self.meta.ended = time.time()
        try:
            self.write_meta(durable=True)
        finally:
            self.untee_output()
        if self.spool is not None:  # after the tee: stdout.log is complete and goes up too
            self.spool.finish(self.settings.spool_wait)


def _digest(body: dict) -> str:
    from ..store.hashing import hash_bytes

    return hash_bytes(dumps(body))
