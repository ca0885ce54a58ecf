"""Reading a spooled experiment back from S3: pull a run, fetch missing blobs, prefetch.

A replay with ``FLOR_SPOOL`` set finds its run locally or in the spool (the newest of both
when no run is named), pulls the run's metadata (``run.json``, manifests, source, logs) when
it is not local, and fetches blobs when a block needs them and they are not local: all of a
manifest's blobs at once, in parallel, while a background thread fetches the blobs of the
epochs the worker will reach next. Every fetched blob is checked against its hash before it
is written to the local store, so a fresh machine with an empty ``FLOR_HOME`` replays the
same bytes that were recorded.
"""

from __future__ import annotations

import atexit
import json
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Iterable

from ..errors import FlorError, ReplayError, StorageError
from .blobs import blob_key
from .spool import blob_hashes, format_size

if TYPE_CHECKING:
    from .experiment import ExperimentStore
    from .s3 import S3Backend

__all__ = [
    "LazyRemote", "Progress", "RemoteBlobs", "attach_spool", "find_spooled_run", "open_spool", "pick_run", "prefetch_plan", "pull_run",
    "spooled_runs",
]


class Progress:
    """A one-line progress bar on a terminal; elsewhere one closing line when it took a while."""

    def __init__(self, label: str, total: int, *, stream: Any = None, quiet_under_s: float = 1.0) -> None:
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.done = self.nbytes = 0
        self.started = time.monotonic()
        self.quiet_under_s = quiet_under_s
        self._drawn = 0.0
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False

    def update(self, n: int = 1, nbytes: int = 0) -> None:
        self.done += n
        self.nbytes += nbytes
        now = time.monotonic()
        if self.tty and (now - self._drawn > 0.1 or self.done == self.total):
            self._drawn = now
            width = 24
            fill = int(width * self.done / max(1, self.total))
            self.stream.write(f"\rflor: {self.label} [{'#' * fill}{'.' * (width - fill)}] "
                              f"{self.done}/{self.total}, {format_size(self.nbytes)}")
            self.stream.flush()

    def close(self) -> None:
        took = time.monotonic() - self.started
        if self.tty and self._drawn:
            self.stream.write("\n")
        elif self.done and took >= self.quiet_under_s:
            self.stream.write(f"flor: {self.label}: {self.done}/{self.total}, {format_size(self.nbytes)} "
                              f"in {took:.1f} s\n")
        self.stream.flush()


class RemoteBlobs:
    """Fetch blobs missing from a local store out of the spool; the fallback of ``BlobStore``."""

    def __init__(self, store: ExperimentStore, remote: S3Backend, *, workers: int = 8) -> None:
        self.store, self.remote = store, remote
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="flor-fetch")
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.fetched = self.fetched_bytes = self.prefetched = 0
        self._prefetching: threading.Thread | None = None
        self._stop = threading.Event()

    def _fetch(self, digest: str) -> int:
        key = blob_key(digest)
        if self.store.backend.exists(key):
            return 0
        data = self.remote.get(f"{self.store.name}/{key}", digest=digest)
        self.store.backend.write(key, data, durable=False)  # a lost blob is fetched again
        with self._lock:
            self.fetched += 1
            self.fetched_bytes += len(data)
        return len(data)

    def _submit(self, digest: str) -> Future | None:
        with self._lock:
            fut = self._futures.get(digest)
            if fut is not None and not (fut.done() and fut.exception() is not None):
                return fut
            if self.store.backend.exists(blob_key(digest)):
                return None
            fut = self._futures[digest] = self._pool.submit(self._fetch, digest)
            return fut

    def ensure(self, digests: Iterable[str], *, label: str | None = None) -> None:
        """Make ``digests`` local, fetching the missing ones in parallel; StorageError if one fails."""
        futures = [f for f in (self._submit(d) for d in set(digests)) if f is not None]
        if not futures:
            return
        bar = Progress(label or f"fetching blobs from {self.remote.where(self.store.name)}", len(futures))
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when="FIRST_COMPLETED")
            for f in done:
                bar.update(1, f.result() if f.exception() is None else 0)
        bar.close()
        for f in futures:
            exc = f.exception()
            if exc is not None:
                raise exc if isinstance(exc, FlorError) else StorageError(f"fetching a blob failed: {exc}")

    def prefetch(self, groups: list[set[str]]) -> None:
        """Fetch ``groups`` (the blobs of each upcoming epoch, in order) in the background,
        one group at a time, so downloads run ahead of the replay without flooding the disk."""

        def run() -> None:
            for group in groups:
                if self._stop.is_set():
                    return
                futures = [f for f in (self._submit(d) for d in group) if f is not None]
                wait(futures)
                with self._lock:
                    self.prefetched += sum(1 for f in futures if f.exception() is None)

        self._prefetching = threading.Thread(target=run, name="flor-prefetch", daemon=True)
        self._prefetching.start()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def report(self) -> None:
        if self.fetched:
            s = self.remote.stats
            ahead = f", {self.prefetched} of them ahead of need" if self.prefetched else ""
            print(f"flor: fetched {self.fetched} blobs ({format_size(self.fetched_bytes)}) from "
                  f"{self.remote.where(self.store.name)}{ahead}, {s.retries} retries", file=sys.stderr)


class LazyRemote:
    """The spool a run was recorded to, opened only when one of its blobs is not local: a
    replay of a run whose blobs were evicted (``FLOR_SPOOL_BUDGET``, ``flor spool --evict``)
    fetches them back even when ``FLOR_SPOOL`` is not set, and needs no network otherwise."""

    def __init__(self, store: ExperimentStore, url: str) -> None:
        self.store, self.url = store, url
        self._fetcher: RemoteBlobs | None = None
        self._lock = threading.Lock()

    def ensure(self, digests: Iterable[str]) -> None:
        digests = list(digests)
        if not digests:
            return
        with self._lock:
            if self._fetcher is None:
                print(f"flor: blobs of this run are not local (evicted?); fetching them from {self.url}, "
                      "where it was spooled", file=sys.stderr)
                self._fetcher = RemoteBlobs(self.store, open_spool(self.url))
                atexit.register(self._fetcher.report)
        self._fetcher.ensure(digests)


# -- runs in the spool -----------------------------------------------------------------


def spooled_runs(remote: S3Backend, name: str) -> list[str]:
    """Ids of the runs of ``name`` in the spool, oldest first."""
    return remote.list_dirs(f"{name}/runs/")


def pick_run(run: str | None, runs: list[str], name: str, where: str) -> str:
    """The run ``run`` names among ``runs`` (exactly or by unique prefix), or the latest."""
    if not runs:
        raise ReplayError(f"nothing recorded for {name!r} {where}: record first with "
                          f"`python SCRIPT.py --flor {name}`, or check FLOR_SPOOL and FLOR_HOME")
    if run is None or run == "latest":
        return runs[-1]
    matches = [r for r in runs if r == run or r.startswith(run)]
    if len(matches) != 1:
        raise ReplayError(f"run {run!r} of {name} is {'ambiguous' if matches else 'unknown'} {where}; "
                          f"the runs are: {', '.join(runs[-10:])}")
    return matches[0]


def open_spool(url: str, workers: int = 8) -> S3Backend:
    """An ``S3Backend`` for ``url`` whose endpoint, bucket and credentials were just checked."""
    from .s3 import S3Backend

    remote = S3Backend(url, max_pool=workers + 4)
    remote.check()
    return remote


def find_spooled_run(store: ExperimentStore, url: str, run: str | None) -> str:
    """The run ``run`` names (or the latest) among the local and spooled runs of ``store``."""
    runs = sorted(set(store.runs()) | set(spooled_runs(open_spool(url), store.name)))
    return pick_run(run, runs, store.name, f"under {store.root} or in {url}")


def pull_run(store: ExperimentStore, remote: S3Backend, run: str, *, blobs: bool = True,
             fetcher: RemoteBlobs | None = None, workers: int = 8) -> int:
    """Copy run ``run`` from the spool into ``store``: metadata, then (with ``blobs``) every blob
    its checkpoints name. ``run.json`` is written last, so a run only counts as local once
    complete. Returns the number of files written."""
    prefix = f"{store.name}/"
    listed = remote.list(f"{prefix}runs/{run}/")
    keys = {k[len(prefix):]: size for k, size in listed}
    run_json = store.run_key(run, "run.json")
    if run_json not in keys:
        raise ReplayError(f"run {run} in {remote.where(store.name)} has no run.json yet (still spooling?); "
                          f"run `flor spool {store.name}` where it was recorded")
    manifests_dir = store.run_key(run, "checkpoints") + "/"

    def wanted(key: str) -> bool:
        if key == run_json:
            return False
        local = store.backend.path(key)  # manifests and sources never change: keep a same-size copy
        return not (key.startswith(manifests_dir) or "/source/" in key) or not (
            local.is_file() and local.stat().st_size == keys[key])

    todo = sorted(k for k in keys if wanted(k))
    bar = Progress(f"pulling run {run} metadata", len(todo))

    def one(key: str) -> int:
        data = remote.get(prefix + key)
        store.backend.write(key, data, durable=False)
        return len(data)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="flor-pull") as pool:
        for n in pool.map(one, todo):
            bar.update(1, n)
    bar.close()
    if blobs:
        hashes: set[str] = set()
        for block, epoch, occ in store.manifests(run):
            blob_hashes(store.read_manifest(run, block, epoch, occ), hashes)
        fetcher = fetcher or RemoteBlobs(store, remote, workers=workers)
        fetcher.ensure(hashes, label=f"fetching {len(hashes)} blobs of run {run}")
    store.backend.write(run_json, remote.get(prefix + run_json))
    return len(todo) + 1


# -- replay ----------------------------------------------------------------------------


def attach_spool(store: ExperimentStore, url: str, run: str | None) -> RemoteBlobs | None:
    """Make run ``run`` (or the latest, local or spooled) replayable from ``store`` with the
    spool at ``url`` behind it: pull its metadata when it is not local (or when the local copy
    was pulled before the recording finished), and let ``store.blobs`` fetch missing blobs.

    When the spool cannot be reached but the run is local, replay goes on from local files.
    """
    try:
        remote = open_spool(url)
        local, spooled = store.runs(), spooled_runs(remote, store.name)
        chosen = pick_run(run, sorted(set(local) | set(spooled)), store.name, f"under {store.root} or in {url}")
        if chosen not in local:
            pull_run(store, remote, chosen, blobs=False)
        elif store.read_run(chosen).get("status") != "finished" and chosen in spooled:
            # pulled while it was still recording elsewhere: refresh once the recording is done
            if json.loads(remote.get(f"{store.name}/runs/{chosen}/run.json")).get("status") == "finished":
                pull_run(store, remote, chosen, blobs=False)
    except StorageError as exc:
        try:
            store.resolve_run(run)
        except ReplayError:
            raise exc from None
        print(f"flor: the spool {url} is not usable ({exc}); replaying from local files only", file=sys.stderr)
        return None
    fetcher = RemoteBlobs(store, remote)
    store.blobs.remote = fetcher
    atexit.register(fetcher.report)
    return fetcher


def prefetch_plan(store: ExperimentStore, run: str, meta: dict, epochs: range,
                  available: set[tuple[str, int | None, int]]) -> None:
    """Start fetching, in order, the blobs of the checkpoints of ``epochs`` not yet local."""
    fetcher = store.blobs.remote
    if not isinstance(fetcher, RemoteBlobs):
        return
    groups = []
    for epoch in epochs:
        group: set[str] = set()
        for name, occ in meta.get("epoch_blocks", {}).get(str(epoch), []):
            if (name, epoch, occ) in available:
                try:
                    blob_hashes(store.read_manifest(run, name, epoch, occ), group)
                except FlorError:
                    continue  # replay reports an unusable checkpoint where it meets it
        if group:
            groups.append(group)
    if groups:
        fetcher.prefetch(groups)
