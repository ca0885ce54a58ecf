"""Recording: run metadata, logs, stdout and a checkpoint of every block at every epoch."""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Iterator

from .errors import StateError
from .logs import LogWriter
from .runinfo import git_info, redact_argv, script_info, versions
from .session import Session, as_result, copy_source, new_run_id, warn
from .settings import Settings
from .store import BackgroundWriter
from .store.experiment import dumps

__all__ = ["RecordSession"]


class RecordSession(Session):
    mode = "record"

    def __init__(self, settings: Settings) -> None:
        import torch

        super().__init__(settings)
        self.run = new_run_id()
        self.run_dir = self.store.run_path(self.run)
        self.run_dir.mkdir(parents=True)
        script = script_info(sys.argv[0] if sys.argv else "")
        git, diff = git_info(script["script"])
        self.meta: dict[str, Any] = {
            "format": 1, "name": settings.name, "run": self.run, "status": "running", "pid": os.getpid(),
            "argv": redact_argv(list(sys.argv)), "cwd": os.getcwd(), **script, "git": git,
            "versions": versions(), "torch_threads": torch.get_num_threads(),
            "started": self.started, "ended": None, "checkpoint_every": settings.every,
            "epochs_planned": None, "epochs_done": 0, "epoch_blocks": {}, "outside_blocks": [],
            "checkpoint_failures": [], "timings": {"epoch_s": [], "blocks": {}},
        }
        self.write_meta()
        copy_source(script["script"], self.run_dir / "source")
        if diff:
            (self.run_dir / "source" / "diff.patch").write_text(diff)
        self.logs = LogWriter(self.run_dir / "logs" / "record.jsonl")
        self.writer = BackgroundWriter()
        self.epoch_started = 0.0
        self.epoch_blocks: list[list] = []
        self.tee_output(self.run_dir / "stdout.log")

    def write_meta(self, *, durable: bool = False) -> None:
        self.store.write_json(self.store.run_key(self.run, "run.json"), self.meta, durable=durable)

    # -- the loop ----------------------------------------------------------------------

    def iterate(self, iterable: Any) -> Iterator[Any]:
        self.begin_loop()
        try:
            self.meta["epochs_planned"] = len(iterable)
        except TypeError:
            pass  # a generator: the count is known at the end
        try:
            for epoch, item in enumerate(iterable):
                self.epoch, self.epoch_blocks = epoch, []
                self.epoch_started = time.perf_counter()
                yield item
                self.end_epoch(epoch)
        finally:
            self.end_loop()

    def end_epoch(self, epoch: int) -> None:
        self.meta["epochs_done"] = epoch + 1
        self.meta["epoch_blocks"][str(epoch)] = self.epoch_blocks
        self.meta["timings"]["epoch_s"].append(round(time.perf_counter() - self.epoch_started, 6))
        self.logs.flush()
        self.write_meta()

    # -- blocks ------------------------------------------------------------------------

    def step_into(self, name: str, probed: bool) -> bool:
        self.open_block(name)
        return True

    def checkpoint_due(self, epoch: int | None) -> bool:
        return epoch is None or epoch % self.settings.every == 0

    def end(self, objs: tuple) -> Any:
        name, epoch, occ = self.close_block()
        elapsed = time.perf_counter() - self.block_started
        if epoch is None:
            self.meta["outside_blocks"].append([name, occ])
        else:
            self.epoch_blocks.append([name, occ])
        self.meta["timings"]["blocks"].setdefault(name, []).append(round(elapsed, 6))
        if self.checkpoint_due(epoch):
            self.checkpoint(name, epoch, occ, objs, elapsed)
        return as_result(objs)

    def checkpoint(self, name: str, epoch: int | None, occ: int, objs: tuple, elapsed: float) -> None:
        from .state import capture_rng, snapshot

        t0 = time.perf_counter()
        try:
            objects = snapshot(list(objs))
            rng = snapshot(capture_rng())
        except StateError as exc:
            self._failed(name, epoch, exc)
            return
        snap_s = time.perf_counter() - t0
        manifest_key = self.store.manifest_key(self.run, name, epoch, occ)
        nbytes = objects.nbytes + rng.nbytes

        def job() -> None:
            written: list[int] = [0]
            dirs: set[str] = set()

            def put(data: Any, digest: str) -> None:
                _, new = self.store.blobs.put(data, digest)
                if new:
                    written[0] += len(data)
                    dirs.add(f"objects/{digest[:2]}")

            tree = objects.materialize(put)
            rng_tree = rng.materialize(put)
            for d in dirs:  # the blobs' renames are durable before the manifest names them
                self.store.backend.sync_dir(d)
            body = {"objects": tree, "rng": rng_tree}
            manifest = {
                "format": 1, "block": name, "epoch": epoch, "occurrence": occ, "count": len(objs),
                **body, "digest": _digest(body), "bytes": nbytes, "new_bytes": written[0],
                "block_s": round(elapsed, 6), "snapshot_s": round(snap_s, 6), "created": time.time(),
            }
            self.store.write_json(manifest_key, manifest)

        self.writer.submit(job, nbytes, lambda exc: self._failed(name, epoch, exc))

    def _failed(self, name: str, epoch: int | None, exc: BaseException) -> None:
        self.meta["checkpoint_failures"].append({"block": name, "epoch": epoch, "error": repr(exc)})
        warn(f"checkpoint of block {name!r} at epoch {epoch} failed ({exc}); training goes on "
             "and a replay will re-execute that epoch")

    # -- logs and exit -----------------------------------------------------------------

    def write_log(self, name: str, value: Any, step: Any) -> None:
        self.logs.add(name, value, self.epoch, step, self.open[0] if self.open else None, self.where())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.logs.flush()
            self.writer.close()
        except Exception:  # noqa: BLE001 - report, then still write the final status
            traceback.print_exc()
        self.meta["status"] = "finished" if self.exit_error is None else (
            "interrupted" if self.exit_error == "interrupted" else "crashed")
        if self.exit_error not in (None, "interrupted"):
            self.meta["error"] = self.exit_error
        self.meta["ended"] = time.time()
        try:
            self.write_meta(durable=True)
        finally:
            self.untee_output()


def _digest(body: dict) -> str:
    from .store.hashing import hash_bytes

    return hash_bytes(dumps(body))

