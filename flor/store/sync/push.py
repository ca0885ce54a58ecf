"""Push: upload an experiment to its spool, verified, resumable, in the safe order.

Order is what makes a partial spool safe to read: the blobs a manifest names, each verified
in S3 (size, xxh3 metadata, MD5 ETag); the manifest, once all its blobs are verified; the rest
of the run folder; ``run.json`` last. Every verified upload is appended to the journal
(``flor.store.journal``), so an interrupted spool resumes where it stopped and a blob goes up
once per spool URL. Local blobs are evicted only when the journal holds them and, for an
explicit eviction, a fresh HEAD confirms them.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..._fmt import human_size
from ...errors import CorruptBlobError, FlorError, StorageError, warn
from ..blobs import blob_key
from ..experiment import blob_hashes
from ..hashing import hash_bytes
from ..ids import is_blob_hash
from ..journal import SpoolJournal

if TYPE_CHECKING:
    from ..experiment import ExperimentStore
    from ..s3 import S3Backend

__all__ = ["BackgroundSpool", "Spooler", "parallel", "spool_files"]

#: where a one-line message for people goes (the caller prints it)
Say = Callable[[str], None]


def parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int) -> list:
    """``[fn(item) for item in items]`` on up to ``workers`` threads started for this call.

    Not concurrent.futures: a recording's last uploads run in an atexit handler, where its
    executors refuse new work. ``fn`` must not raise.

    >>> parallel(lambda x: x * 2, [1, 2, 3], workers=2)
    [2, 4, 6]
    """
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    results: list = [None] * len(items)
    pending = iter(enumerate(items))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                nxt = next(pending, None)
            if nxt is None:
                return
            results[nxt[0]] = fn(nxt[1])

    threads = [threading.Thread(target=work, name="flor-spool", daemon=True) for _ in range(min(workers, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results



@dataclass
class SpoolCounts:
    uploaded: int = 0  # objects sent and verified by this spooler
    uploaded_bytes: int = 0
    present: int = 0  # found already in S3 (verified by HEAD), not sent again
    journaled: int = 0  # skipped: the journal says they were verified before
    failed: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    @property
    def verified(self) -> int:
        return self.uploaded + self.present


class Spooler:
    """Upload the runs of one experiment to ``url``, verified, resumable and incremental.

    (needs an S3 bucket, so the example is not run as a doctest)

    >>> Spooler(ExperimentStore(home, "demo"), "s3://bucket/flor").spool()   # doctest: +SKIP
    """

    def __init__(self, store: ExperimentStore, url: str, *, workers: int = 8,
                 remote: S3Backend | None = None) -> None:
        from ..s3 import S3Backend

        self.store = store
        self.url = url
        self.remote = remote or S3Backend(url, max_pool=workers + 4)
        self.journal = SpoolJournal(store.root, url)
        self.counts = SpoolCounts()
        self.workers = max(1, workers)
        self.failures: list[str] = []

    def rkey(self, key: str) -> str:
        """The S3 key (below the prefix) of an experiment-relative key."""
        return f"{self.store.name}/{key}"

    def close(self) -> None:
        self.journal.close()

    def upload_blob(self, digest: str) -> None:
        key = blob_key(digest)
        if self.journal.has(key):
            self.counts.add(journaled=1)
            return
        data = self.store.backend.read(key)  # StorageError when missing
        if hash_bytes(data) != digest:  # never spool a damaged blob as if it were good
            raise CorruptBlobError(f"local blob {digest} is corrupt ({self.store.backend.path(key)}); not uploaded")
        found = self.remote.head(self.rkey(key))
        if found is not None and found.size == len(data) and found.digest == digest:
            self.counts.add(present=1)
        else:
            self.remote.write(self.rkey(key), data, digest=digest)
            self.counts.add(uploaded=1, uploaded_bytes=len(data))
        self.journal.add(key, len(data), digest)

    def upload_file(self, key: str) -> None:
        """Upload a run file unless the journal holds these very bytes (files may grow)."""
        data = self.store.backend.read(key)
        digest = hash_bytes(data)
        if self.journal.has(key, len(data), digest):
            self.counts.add(journaled=1)
            return
        self.remote.write(self.rkey(key), data, digest=digest)
        self.counts.add(uploaded=1, uploaded_bytes=len(data))
        self.journal.add(key, len(data), digest)

    def _each(self, fn: Callable[[str], None], items: Iterable[str]) -> set[str]:
        """Run ``fn`` over ``items`` in parallel; return the items that failed (and note why)."""

        def one(item: str) -> str | None:
            try:
                fn(item)
                return None
            except FlorError as exc:
                self.counts.add(failed=1)
                self.failures.append(str(exc))
                return item

        return {item for item in parallel(one, items, self.workers) if item is not None}

    def _manifests(self, run: str) -> dict[str, set[str]]:
        """Manifest key -> the blob hashes it names, for every committed checkpoint of ``run``."""
        out = {}
        for block, epoch, occ in self.store.manifests(run):
            key = self.store.manifest_key(run, block, epoch, occ)
            try:
                out[key] = blob_hashes(self.store.read_json(key))
            except FlorError as exc:
                self.failures.append(f"{key}: {exc}")
        return out

    def spool_checkpoint(self, manifest_key: str) -> None:
        """One checkpoint: its blobs, then (when every blob is verified) its manifest."""
        hashes = blob_hashes(self.store.read_json(manifest_key))
        if self._each(self.upload_blob, sorted(hashes)):
            raise StorageError(f"{manifest_key} is not spooled: {self.failures[-1]}")
        self.upload_file(manifest_key)

    def spool_run(self, run: str) -> None:
        """Everything under ``runs/<run>/`` in the safe order; raises when anything is left."""
        before = len(self.failures)
        manifests = self._manifests(run)
        failed_blobs = self._each(self.upload_blob, sorted(set().union(*manifests.values())))
        self._each(self.upload_file, [k for k, hashes in sorted(manifests.items()) if not hashes & failed_blobs])
        run_json = self.store.run_key(run, "run.json")
        others = [k for k in self.store.backend.list(self.store.run_key(run)) if k != run_json and k not in manifests]
        self._each(self.upload_file, others)
        if len(self.failures) == before:
            self._each(self.upload_file, [run_json])
        left = len(self.failures) - before
        if left:
            raise StorageError(
                f"{left} object(s) of run {run} could not be spooled to {self.url} (first: "
                f"{self.failures[before]}); run `flor spool {self.store.name}` again to finish"
            )

    def spool(self, runs: list[str] | None = None) -> None:
        """Spool ``runs`` (default: every run of the experiment); raise after trying them all."""
        errors = []
        for run in runs if runs is not None else self.store.runs():
            try:
                self.spool_run(run)
            except StorageError as exc:
                errors.append(str(exc))
        self.journal.close()
        if errors:
            raise StorageError(errors[0] if len(errors) == 1 else f"{len(errors)} runs are incomplete; {errors[0]}")

    def _local_blobs(self) -> list[tuple[str, int, float]]:
        """``(digest, size, mtime)`` of every local blob."""
        out: list[tuple[str, int, float]] = []
        base = self.store.root / "objects"
        if not base.is_dir():
            return out
        for sub in os.scandir(base):
            if not sub.is_dir(follow_symlinks=False):  # a link leading out is never evicted from
                continue
            for f in os.scandir(sub.path):
                if not is_blob_hash(sub.name + f.name) or len(sub.name) != 2:
                    continue  # a write in progress (.tmp-*) or a stray file: not a blob
                try:
                    st = f.stat()
                except OSError:
                    continue
                out.append((sub.name + f.name, st.st_size, st.st_mtime))
        return out

    def evict(self, runs: list[str] | None = None, *, recheck: bool = True) -> int:
        """Delete local blobs (of ``runs``, default all) that are verified in S3; return how many stay."""
        local = self._local_blobs()
        if runs is not None:
            wanted = set().union(set(), *(h for r in runs for h in self._manifests(r).values()))
            local = [b for b in local if b[0] in wanted]
        kept = [b for b in local if not self.journal.has(blob_key(b[0]))]
        candidates = [b for b in local if self.journal.has(blob_key(b[0]))]

        def evict_one(item: tuple[str, int, float]) -> bool:
            digest, size, _ = item
            key = blob_key(digest)
            if recheck:
                try:
                    found = self.remote.head(self.rkey(key))
                except FlorError as exc:
                    self.failures.append(str(exc))
                    return False
                if found is None or found.size != size or found.digest != digest:
                    return False
            try:
                self.store.backend.delete(key)
            except FlorError as exc:  # objects/ leads out of the store: refused, and reported
                self.failures.append(str(exc))
                return False
            self.counts.add(evicted=1, evicted_bytes=size)
            return True

        return len(kept) + parallel(evict_one, candidates, self.workers).count(False)

    def enforce_budget(self, budget: int) -> None:
        """Evict the oldest verified blobs until local blobs take at most ``budget`` bytes."""
        local = self._local_blobs()
        total = sum(size for _, size, _ in local)
        for digest, size, _ in sorted(local, key=lambda b: b[2]):
            if total <= budget:
                break
            if self.journal.has(blob_key(digest)):
                self.store.backend.delete(blob_key(digest))
                self.counts.add(evicted=1, evicted_bytes=size)
                total -= size

    def summary(self) -> str:
        c, s = self.counts, self.remote.stats
        text = (f"{c.verified} objects verified in {self.url} ({c.uploaded} uploaded, "
                f"{human_size(c.uploaded_bytes, base=1000)}; {c.present} found there already), {c.journaled} "
                f"skipped as verified before; {s.retries} retries ({s.request_retries} requests resent, "
                f"{s.op_retries} operations repeated, {s.verify_failures} failed verification)")
        if c.evicted:
            text += f"; evicted {c.evicted} local blobs ({human_size(c.evicted_bytes, base=1000)})"
        return text


class BackgroundSpool:
    """Spool one recording while it runs. Training never waits on the network, and a failing
    upload is a warning: ``flor spool NAME`` finishes the job later.

    Checkpoints are queued by the writer as their manifests commit; logs and ``run.json`` at
    most every ``interval`` seconds; ``finish`` queues the whole run folder and waits for it,
    at most ``wait`` seconds, then hands the summary line to ``say``.
    """

    def __init__(self, store: ExperimentStore, run: str, url: str, *, budget: int | None = None,
                 interval: float = 15.0, say: Say | None = None) -> None:
        self.store, self.run, self.url = store, run, url
        self.budget = budget
        self.interval = interval
        self.say = say or (lambda text: None)
        self.spooler: Spooler | None = None
        self.error: str | None = None  # why spooling stopped for this process
        self._queue: queue.Queue = queue.Queue()
        self._sync_queued = False
        self._last_sync = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._work, name="flor-spool", daemon=True)
        self._thread.start()

    def checkpoint(self, manifest_key: str) -> None:
        self._queue.put(("checkpoint", manifest_key))

    def sync(self) -> None:
        """Queue an upload of the run's logs and metadata, unless one ran recently."""
        if not self._sync_queued and time.monotonic() - self._last_sync >= self.interval:
            self._sync_queued = True
            self._queue.put(("sync", None))

    def _start(self) -> Spooler | None:
        if self.spooler is None and self.error is None:
            try:
                spooler = Spooler(self.store, self.url)
                spooler.remote.check()
                self.spooler = spooler
            except FlorError as exc:
                self.error = str(exc)
                warn("FL403", f"spooling to {self.url} is off for this run: {exc}; training goes on, and "
                     f"`flor spool {self.store.name}` uploads the run once that is fixed")
        return self.spooler

    def _work(self) -> None:
        while True:
            kind, arg = self._queue.get()
            if kind == "stop":
                return
            try:
                spooler = self._start()
                if spooler is None:
                    continue
                if kind == "checkpoint":
                    spooler.spool_checkpoint(arg)
                elif kind == "sync":
                    self._sync_queued = False
                    self._last_sync = time.monotonic()
                    for key in self.store.backend.list(self.store.run_key(self.run, "logs")) + [
                            self.store.run_key(self.run, "run.json")]:
                        spooler.upload_file(key)
                elif kind == "final":
                    spooler.spool_run(self.run)
                if self.budget is not None and kind != "sync":
                    spooler.enforce_budget(self.budget)
            except Exception as exc:  # noqa: BLE001 - an upload must never reach training
                warn("FL404", f"spooling to {self.url}: {exc}")
            finally:
                if kind == "final":
                    self._done.set()

    def finish(self, wait: float) -> bool:
        """Upload the rest of the run, waiting at most ``wait`` seconds; say how it went."""
        self._queue.put(("final", None))
        self._queue.put(("stop", None))
        try:
            finished = self._done.wait(wait)
        except KeyboardInterrupt:
            finished = False
        name = self.store.name
        if self.error is not None:
            warn("FL405", f"the run was not spooled ({self.error}); "
                 f"after fixing that, run `flor spool {name} {self.url}`")
            return False
        spooler = self.spooler
        if not finished or spooler is None:
            warn("FL405", f"spooling run {self.run} to {self.url} did not finish within {wait:.0f} s "
                 f"(FLOR_SPOOL_WAIT); what is verified is kept: run `flor spool {name}` to upload the rest")
            return False
        spooler.journal.close()
        if spooler.failures:
            warn("FL405", f"partly spooled run {self.run}: {spooler.summary()}; {len(spooler.failures)} uploads failed "
                 f"(first: {spooler.failures[0]}); run `flor spool {name}` to finish")
            return False
        self.say(f"spooled run {self.run}: {spooler.summary()}")
        return True


def spool_files(store: ExperimentStore, url: str, keys: list[str]) -> None:
    """Upload a few files (a replay worker's logs) to the spool; warn, never raise."""
    try:
        spooler = Spooler(store, url, workers=2)
        try:
            for key in keys:
                if store.backend.exists(key):
                    spooler.upload_file(key)
        finally:
            spooler.close()
    except FlorError as exc:
        warn("FL404", f"could not spool {', '.join(keys)} to {url}: {exc}")


