"""Pull: read a spooled experiment back: a run's metadata, and blobs on demand or ahead of need.

A replay with ``FLOR_SPOOL`` finds its run locally or in the spool, pulls the run's metadata
when it is not local, and fetches blobs when a block needs them (a manifest's blobs at once, in
parallel) while a background thread fetches the blobs of the epochs the worker reaches next.
Every fetched blob is checked against its hash before it is written locally.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..._files import MAX_METADATA
from ..._fmt import human_size
from ...errors import FlorError, ReplayError, StorageError, warn
from ..blobs import blob_key
from ..experiment import blob_hashes, pick_run
from ..ids import bad_key_reason, is_blob_hash, is_run_id
from ..runmeta import RunMeta

if TYPE_CHECKING:
    from ..experiment import ExperimentStore
    from ..s3 import S3Backend

__all__ = [
    "LazyRemote", "RemoteBlobs", "attach_spool", "find_spooled_run", "open_spool", "prefetch_plan", "pull_run",
    "spooled_runs",
]

#: ``progress(total, label)`` -> a bar with ``update(n)`` and ``close()``, e.g. ``flor._fmt.progress``
Progress = Callable[[int, str], Any]
#: where a one-line message for people goes (the caller prints it)
Say = Callable[[str], None]


#: the most files one run may have in a bucket for ``pull_run`` (manifests, logs, sources, plots)
MAX_RUN_KEYS = 200_000


class _NoBar:
    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


def _bar(progress: Progress | None, total: int, label: str) -> Any:
    return progress(total, label) if progress is not None else _NoBar()


def open_spool(url: str, workers: int = 8) -> S3Backend:
    """An ``S3Backend`` for ``url`` whose endpoint, bucket and credentials were just checked."""
    from ..s3 import S3Backend

    remote = S3Backend(url, max_pool=workers + 4)
    remote.check()
    return remote



class RemoteBlobs:
    """Fetch blobs missing from a local store out of the spool: the remote of a ``BlobStore``."""

    def __init__(self, store: ExperimentStore, remote: S3Backend, *, workers: int = 8,
                 progress: Progress | None = None) -> None:
        self.store, self.remote, self.progress = store, remote, progress
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="flor-fetch")
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self.fetched = self.fetched_bytes = self.prefetched = 0
        self._stop = threading.Event()

    def _fetch(self, digest: str) -> int:
        key = blob_key(digest)
        if self.store.backend.exists(key):
            return 0
        data = self.remote.read(f"{self.store.name}/{key}", digest=digest)
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
        bar = _bar(self.progress, len(futures), label or f"fetching blobs from {self.remote.where(self.store.name)}")
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.1, return_when="FIRST_COMPLETED")
            bar.update(len(done))
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

        threading.Thread(target=run, name="flor-prefetch", daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def summary(self) -> str | None:
        """What was fetched, for the caller to print at exit; None when nothing was."""
        if not self.fetched:
            return None
        ahead = f", {self.prefetched} of them ahead of need" if self.prefetched else ""
        return (f"fetched {self.fetched} blobs ({human_size(self.fetched_bytes, base=1000)}) from "
                f"{self.remote.where(self.store.name)}{ahead}, {self.remote.stats.retries} retries")


class LazyRemote:
    """The spool a run was recorded to, opened only when one of its blobs is not local: a
    replay of a run whose blobs were evicted (``FLOR_SPOOL_BUDGET``, ``flor spool --evict``)
    fetches them back even when ``FLOR_SPOOL`` is not set, and needs no network otherwise.

    Only from a spool this user recorded or spooled to (``trusted``:
    ``flor.store.trust.spool_trusted``): the URL comes from ``run.json`` or a spool journal,
    which anyone who writes to the store could have planted, and fetching signs requests with
    this user's credentials. From another, nothing is fetched (the blobs stay missing: their
    blocks run again) and the user is told, once, how to opt in."""

    def __init__(self, store: ExperimentStore, url: str, *, say: Say | None = None,
                 progress: Progress | None = None, trusted: bool = True) -> None:
        self.store, self.url, self.progress, self.trusted = store, url, progress, trusted
        self.say = say or (lambda text: None)
        self._fetcher: RemoteBlobs | None = None
        self._lock = threading.Lock()
        self._refused = False

    def ensure(self, digests: Iterable[str]) -> None:
        digests = list(digests)
        if not digests:
            return
        with self._lock:
            if not self.trusted:
                if not self._refused:
                    self._refused = True
                    self.say(f"FL406 blobs of this run are not local (evicted?) and the store names the spool "
                             f"{self.url!r} for them, which you never recorded or spooled to: not fetched from it, "
                             f"so as not to send your credentials to a bucket the store names; if it is yours, "
                             f"replay with FLOR_SPOOL={self.url}")
                return
            if self._fetcher is None:
                self.say(f"FL407 blobs of this run are not local (evicted?); fetching them from {self.url}, "
                         "where it was spooled")
                self._fetcher = RemoteBlobs(self.store, open_spool(self.url), progress=self.progress)
        self._fetcher.ensure(digests)

    def summary(self) -> str | None:
        return self._fetcher.summary() if self._fetcher is not None else None


def spooled_runs(remote: S3Backend, name: str) -> list[str]:
    """Ids of the runs of ``name`` in the spool, oldest first; folders whose names are not run
    ids (``..``, ``a\\b``, planted by someone with write access to the bucket) are left out."""
    found = remote.list_dirs(f"{name}/runs/")
    bad = [r for r in found if not is_run_id(r)]
    if bad:
        warn("FL408", f"ignoring {len(bad)} folder(s) under {remote.where(name)}/runs/ whose names are not run ids: "
             f"{', '.join(repr(b)[:80] for b in bad[:5])}")
    return [r for r in found if is_run_id(r)]


def safe_run_keys(listed: list[tuple[str, int]], prefix: str) -> tuple[dict[str, int], list[str]]:
    """``({key: size}, refused)``: the listed S3 keys with ``prefix`` cut off, split into the keys
    that name a file inside the store and those that could not (``..``, absolute paths,
    backslashes, NUL, empty segments), each of those with the reason.

    >>> safe_run_keys([("p/runs/r/a.json", 2), ("p/runs/r/../../../x", 1)], "p/")
    ({'runs/r/a.json': 2}, ["'p/runs/r/../../../x' (a '..' segment)"])
    """
    keys, refused = {}, []
    for key, size in listed:
        rel = key[len(prefix):] if key.startswith(prefix) else key
        reason = bad_key_reason(rel) if key.startswith(prefix) else "not under the prefix"
        if reason is None:
            keys[rel] = size
        else:
            refused.append(f"{key!r:.120} ({reason})")
    return keys, refused


def find_spooled_run(store: ExperimentStore, url: str, run: str | None) -> str:
    """The run ``run`` names (or the latest) among the local and spooled runs of ``store``."""
    runs = sorted(set(store.runs()) | set(spooled_runs(open_spool(url), store.name)))
    return pick_run(run, runs, store.name, f"under {store.root} or in {url}")


def pull_run(store: ExperimentStore, remote: S3Backend, run: str, *, blobs: bool = True,
             fetcher: RemoteBlobs | None = None, workers: int = 8, progress: Progress | None = None) -> int:
    """Copy run ``run`` from the spool into ``store``: metadata, then (with ``blobs``) every blob
    its checkpoints name. ``run.json`` is written last, so a run only counts as local once
    complete. Returns the number of files written."""
    prefix = f"{store.name}/"
    if not is_run_id(run):
        raise ReplayError(f"refusing to pull run {run!r:.80} from {remote.where(store.name)}: not a run id")
    keys, refused = safe_run_keys(remote.list_sizes(f"{prefix}runs/{run}/"), prefix)
    if len(keys) > MAX_RUN_KEYS:  # a run holds a few files per epoch: millions are planted, to fill the disk
        raise ReplayError(f"refusing to pull run {run} from {remote.where(store.name)}: it holds {len(keys)} files, "
                          f"over the {MAX_RUN_KEYS} a run of flor has; the bucket was damaged or planted")
    big = sorted(k for k, size in keys.items() if size > MAX_METADATA)
    if big:  # metadata, logs, sources: kilobytes to megabytes; one of GBs costs only itself
        warn("FL408", f"left {len(big)} file(s) of run {run} in {remote.where(store.name)}, larger than the "
             f"{human_size(MAX_METADATA)} flor reads of a run's metadata, log or source file: "
             f"{', '.join(f'{prefix + k!r:.120} ({human_size(keys[k])})' for k in big[:5])}"
             f"{' ...' if len(big) > 5 else ''}")
        keys = {k: v for k, v in keys.items() if k not in big}
    if refused:  # planted by someone with write access to the bucket: never written, only reported
        warn("FL408", f"ignored {len(refused)} key(s) of run {run} in {remote.where(store.name)} "
             f"that would lead out of the store: {', '.join(refused[:5])}{' ...' if len(refused) > 5 else ''}")
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
    bar = _bar(progress, len(todo), f"pulling run {run} metadata")

    def one(key: str) -> None:
        store.backend.write(key, remote.read(prefix + key), durable=False)

    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="flor-pull") as pool:
        for _ in pool.map(one, todo):
            bar.update(1)
    bar.close()
    if blobs:
        hashes: set[str] = set()
        for block, epoch, occ in store.manifests(run):
            try:
                blob_hashes(store.read_manifest(run, block, epoch, occ), hashes)
            except FlorError as exc:  # a damaged manifest: its blobs stay in the bucket, the rest comes
                warn("FL409", f"not fetching the blobs of a checkpoint of run {run}: {exc}")
        hashes = {h for h in hashes if is_blob_hash(h)}  # a bad hash is never a file name
        fetcher = fetcher or RemoteBlobs(store, remote, workers=workers, progress=progress)
        fetcher.ensure(hashes, label=f"fetching {len(hashes)} blobs of run {run}")
    data = remote.read(prefix + run_json)
    try:  # checked before it is written: a run.json of another type never enters the store
        RunMeta.from_json(json.loads(data), f"{remote.where(store.name)}/runs/{run}/run.json")
    except StorageError as exc:
        raise ReplayError(f"refusing to pull run {run}: {exc}; not written to {store.root}") from exc
    except (ValueError, RecursionError) as exc:
        raise ReplayError(f"refusing to pull run {run}: its run.json in {remote.where(store.name)} is not valid JSON "
                          f"({type(exc).__name__}); not written to {store.root}") from exc
    store.backend.write(run_json, data)
    return len(todo) + 1


def attach_spool(store: ExperimentStore, url: str, run: str | None, *,
                 progress: Progress | None = None) -> RemoteBlobs | None:
    """Make run ``run`` (or the latest, local or spooled) replayable from ``store`` with the
    spool at ``url`` behind it: pull its metadata when it is not local (or when the local copy
    was pulled before the recording finished); return the fetcher to build the replay's
    ``ExperimentStore(..., remote=...)`` with.

    When the spool cannot be reached but the run is local, warn and return None: replay goes
    on from local files.
    """
    try:
        remote = open_spool(url)
        local, spooled = store.runs(), spooled_runs(remote, store.name)
        chosen = pick_run(run, sorted(set(local) | set(spooled)), store.name, f"under {store.root} or in {url}")
        if chosen not in local:
            pull_run(store, remote, chosen, blobs=False, progress=progress)
        elif store.read_run(chosen).status != "finished" and chosen in spooled:
            # pulled while it was still recording elsewhere: refresh once the recording is done
            try:
                there = json.loads(remote.read(f"{store.name}/runs/{chosen}/run.json"))
            except ValueError:
                there = None  # damaged in the spool: keep the local copy
            if isinstance(there, dict) and there.get("status") == "finished":
                pull_run(store, remote, chosen, blobs=False, progress=progress)
    except StorageError as exc:
        try:
            store.resolve_run(run)
        except ReplayError:
            raise exc from None
        warn("FL410", f"the spool {url} is not usable ({exc}); replaying from local files only")
        return None
    return RemoteBlobs(store, remote, progress=progress)


def prefetch_plan(store: ExperimentStore, run: str, meta: RunMeta, epochs: range,
                  available: set[tuple[str, int | None, int]]) -> None:
    """Start fetching, in order, the blobs of the checkpoints of ``epochs`` not yet local."""
    fetcher = store.blobs.remote
    if not isinstance(fetcher, RemoteBlobs):
        return
    groups = []
    for epoch in epochs:
        group: set[str] = set()
        for name, occ in meta.epoch_blocks.get(str(epoch), []):
            if (name, epoch, occ) in available:
                try:
                    blob_hashes(store.read_manifest(run, name, epoch, occ), group)
                except FlorError:
                    continue  # replay reports an unusable checkpoint where it meets it
        if group:
            groups.append(group)
    if groups:
        fetcher.prefetch(groups)
