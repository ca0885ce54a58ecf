"""run.json of a recording: its writes, the disk set aside for the last one, the failures and
skips it lists, and the final status (``RunRecord``, a part ``flor.engine.record.RecordSession``
owns; the checkpointer and the writer thread note into it too)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..store import ExperimentStore
from ..store.experiment import GrowingDumps
from ..store.runmeta import RunMeta

__all__ = ["LEFT_OPEN", "RUN_JSON_RESERVE", "RunRecord"]

#: disk set aside for the final run.json, the first size that fits: on a disk that fills during
#: the run, its end, its epochs and its failures are still recorded (a replay reads them)
RUN_JSON_RESERVE = (1 << 20, 1 << 18, 1 << 16, 1 << 14)
#: how a block closed without its end() begins its checkpoint_failures entry: the script's own
#: exception or `continue`, not a checkpoint that failed (the exit line counts only those)
LEFT_OPEN = "left open"


class RunRecord:
    """The run's ``RunMeta`` and the one way it is written: never raised, a failure counted
    (``write_failed``). Reentrant: a signal handler may write while the training thread holds it,
    and the writer thread notes its timings and failures here too."""

    def __init__(self, store: ExperimentStore, meta: RunMeta,
                 write_failed: Callable[[str, BaseException], None]) -> None:
        self.store, self.meta, self.write_failed = store, meta, write_failed
        self.lock = threading.RLock()
        self.written: tuple[str, int] | None = None  # (status, epochs_done) of the last run.json written
        self.reserved: Path | None = None
        self._dumps = GrowingDumps()  # run.json grows by an epoch's few items: only those encoded again
        if self.write():  # disk set aside for the final run.json, should the disk fill meanwhile
            self.reserved = store.backend.reserve(store.run_key(meta.run, "run.json"), RUN_JSON_RESERVE)

    def write(self, *, durable: bool = False) -> bool:
        """Write run.json; a failure (a full disk) is counted, never raised: True if written."""
        try:
            with self.lock:
                body = self._dumps(self.meta.to_json())
                seen = (self.meta.status, self.meta.epochs_done)
            self.store.backend.write(self.store.run_key(self.meta.run, "run.json"), body, durable=durable)
            self.written = seen  # what readers will see
            return True
        except Exception as exc:  # noqa: BLE001 - training never stops because run.json cannot be written
            if durable and self.release_reserved():  # the disk filled: the space set aside is for this write
                return self.write(durable=True)
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

    def timing(self, *pairs: Any) -> None:
        """Append ``key, value, key, value ...`` to run.json's per-checkpoint timings (floats to 1 µs)."""
        with self.lock:
            for key, value in zip(pairs[::2], pairs[1::2]):
                self.meta.timings.setdefault(key, []).append(round(value, 6) if isinstance(value, float) else value)

    def checkpoint_failed(self, block: str, epoch: int | None, error: str, occ: int | None = None) -> None:
        entry: dict[str, Any] = {"block": block, "epoch": epoch, "error": error}
        if occ is not None:
            entry["occurrence"] = occ
        with self.lock:
            self.meta.checkpoint_failures.append(entry)

    def checkpoint_skipped(self, block: str, epoch: int | None, reason: str) -> None:
        with self.lock:
            self.meta.checkpoint_skipped.append({"epoch": epoch, "block": block, "reason": reason})

    def failed_checkpoints(self) -> int:
        """Checkpoints that failed, not counting blocks the script's own exception left open."""
        return sum(1 for f in self.meta.checkpoint_failures if not str(f.get("error", "")).startswith(LEFT_OPEN))

    def failures_line(self, write_failures: dict[str, int]) -> str | None:
        """FL115, the exit's count of failed checkpoints and writes; None where none failed. A block
        left open (an exception past its end(): the script's, already reported) is not a checkpoint
        that failed, and a run that crashed was affected: said by its warning only."""
        failed = self.failed_checkpoints()
        if not failed and not write_failures:
            return None
        counts = ", ".join(f"{kind} {n}" for kind, n in sorted(write_failures.items()))
        return (f"flor: FL115 {failed} checkpoint(s) failed" + (f" and writes failed ({counts})" if counts else "")
                + "; training was not affected, a replay re-executes the epochs without a checkpoint"
                + " (run.json: checkpoint_failures, write_failures)")

    def unwritten_line(self, run_dir: Path) -> str:
        """FL116: the final run.json could not be written; what readers will see instead."""
        last = self.written
        return ("flor: FL116 the final run.json could not be written, so the run's end, checkpoint_failures and "
                "write_failures are not recorded: " + (
                    f"the last one written says {last[0]!r} with {last[1]} epoch(s) done, and a replay covers "
                    "only those" if last else "none was ever written, so `flor ls` and replay cannot see this run")
                + f" ({run_dir})")

    def finish(self, exit_error: str | None, terminated_by: str | None,
               ended: tuple[str, int, str | None] | None) -> None:
        """The run's final status: finished, interrupted, terminated (by ``terminated_by``), crashed,
        or what ``sys.exit(n)`` said (``ended``: status, exit code, message)."""
        meta = self.meta
        meta.status = {None: "finished", "interrupted": "interrupted",
                       "terminated": "terminated"}.get(exit_error, "crashed")
        if exit_error not in (None, "interrupted"):  # terminated: the signal's name
            meta.error = terminated_by or exit_error
        if ended is not None:  # sys.exit(n) / SystemExit(n): crashed unless n is 0 or None
            meta.status, meta.exit_code, message = ended
            meta.error = message or meta.error
        meta.ended = time.time()
