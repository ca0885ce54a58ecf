"""Multipart uploads for ``S3Backend``: s3transfer's transfer manager, parts sent in parallel.

The manager works on the ``S3Backend``'s own client, so every part request goes through flor's
``needs-retry`` hook (jitter from a private RNG, never the training script's) and gets a
``Content-MD5`` from ``part_md5``. Its threads are ``Threads``, plain threads, because the last
uploads of a recording run in an atexit handler, where concurrent.futures refuses new work.
s3transfer comes with boto3 and is imported only when a multipart upload starts.
"""

from __future__ import annotations

import base64
import hashlib
import io
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

__all__ = ["Threads", "multipart_etag", "part_md5", "upload_multipart"]


def upload_multipart(client: Any, bucket: str, key: str, view: memoryview, *, metadata: dict[str, str],
                     part_size: int, threshold: int, concurrency: int) -> str:
    """Upload ``view`` to ``bucket/key`` in parts of about ``part_size``, up to ``concurrency``
    at once; return the ETag S3 should report (the MD5 of the parts' MD5s, ``-N``). On failure
    the manager aborts the upload, so no half upload is left behind."""
    from s3transfer.manager import TransferConfig, TransferManager
    from s3transfer.utils import ChunksizeAdjuster

    part_size = ChunksizeAdjuster().adjust_chunksize(part_size, len(view))
    config = TransferConfig(multipart_threshold=threshold, multipart_chunksize=part_size,
                            max_request_concurrency=concurrency)
    with TransferManager(client, config, executor_cls=Threads) as manager:
        manager.upload(io.BytesIO(view), bucket, key, extra_args={"Metadata": metadata}).result()
    return multipart_etag(view, part_size)


def multipart_etag(view: memoryview, part_size: int) -> str:
    """S3's ETag of ``view`` uploaded in parts of ``part_size``.

    >>> multipart_etag(memoryview(bytes(11 << 20)), 5 << 20)[-2:]   # parts of 5, 5 and 1 MiB
    '-3'
    """
    from s3transfer.utils import ChunksizeAdjuster

    part_size = ChunksizeAdjuster().adjust_chunksize(part_size, len(view))
    md5s = [hashlib.md5(view[i:i + part_size], usedforsecurity=False).digest() for i in range(0, len(view), part_size)]
    return f"{hashlib.md5(b''.join(md5s), usedforsecurity=False).hexdigest()}-{len(md5s)}"


def part_md5(params: dict, **_: Any) -> None:
    """botocore hook: give each part s3transfer sends a ``Content-MD5``, which S3 checks."""
    body = params.get("Body")
    if params.get("ContentMD5") or body is None or not hasattr(body, "read") or not hasattr(body, "seek"):
        return
    start, md5 = body.tell(), hashlib.md5(usedforsecurity=False)
    for chunk in iter(lambda: body.read(1 << 20), b""):
        md5.update(chunk)
    body.seek(start)
    params["ContentMD5"] = base64.b64encode(md5.digest()).decode()


class Threads:
    """An executor for s3transfer on plain threads. Not concurrent.futures' pool: a recording's
    last uploads run in an atexit handler, where its executors refuse new work."""

    def __init__(self, max_workers: int | None = None) -> None:
        self._max = max(1, max_workers or 1)
        self._jobs: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args, kwargs))
        with self._lock:
            if self._idle == 0 and len(self._threads) < self._max:
                thread = threading.Thread(target=self._work, name="flor-s3-part", daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1  # that idle thread takes this job
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            future, fn, args, kwargs = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()
