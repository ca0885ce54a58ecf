"""The S3 backend: byte strings under ``s3://bucket/prefix``, uploaded with verification.

boto3 is imported here only, and only when an ``S3Backend`` is made; without it flor says
which extra to install. Credentials, region and endpoint come from boto3's standard chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance roles;
``AWS_DEFAULT_REGION``; ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for S3-compatible
servers); flor never sees, stores or prints them.

Reliability, in layers:

- each HTTP request is retried on throttling (503 SlowDown, 429), 5xx and dropped or
  timed-out connections with jittered exponential backoff, up to ``max_attempts`` times. This
  is botocore's ``standard`` policy, but flor decides it in a ``needs-retry`` hook because
  botocore draws its jitter from the global ``random`` module: from a background thread that
  would shift the training script's Python RNG stream, and replay would diverge from record.
  flor's jitter comes from a private ``random.Random``;
- ``_retry`` repeats a whole operation (upload then verify, download then check) when it
  still fails transiently or verification finds a mismatch;
- an upload counts only once a HEAD shows the expected size, the xxh3 hash flor put in the
  object's metadata and an ETag equal to the MD5 of the bytes (for multipart uploads, the
  MD5 of the parts' MD5s with ``-N``), which catches bytes damaged on the way; servers
  whose ETags are not MD5s (SSE-KMS) are checked by size and metadata only. Every request
  with a body also carries ``Content-MD5``, which S3 itself checks.

Every botocore error is translated into a ``StorageError`` in one place, ``_translate``.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from ..errors import ConfigError, StorageError
from ..redact import redact_text
from ..settings import parse_s3_url
from .hashing import hash_bytes
from .s3parts import multipart_etag, part_md5

__all__ = ["S3Backend", "TransferStats", "parse_s3_url", "read_limit"]

T = TypeVar("T")

_MD5_ETAG_RE = re.compile(r"^[0-9a-f]{32}(-\d+)?$")
META_HASH = "flor-xxh3"  # object metadata key (x-amz-meta-flor-xxh3) holding the content hash

_MiB = 1 << 20


def _import_boto3() -> Any:
    try:
        import boto3
    except ImportError as exc:
        raise ConfigError(
            "spooling to S3 needs boto3, which is not installed: pip install boto3"
                " (or pip install -e '.[s3]' in flor's checkout)"
        ) from exc
    return boto3


@dataclass
class TransferStats:
    """What an ``S3Backend`` did: calls, HTTP attempts, retries and verifications."""

    calls: int = 0  # API calls made
    attempts: int = 0  # HTTP requests sent (calls plus botocore's retries)
    op_retries: int = 0  # whole operations repeated by flor after botocore gave up or verification failed
    verify_failures: int = 0  # uploads or downloads whose size, hash or ETag did not match
    uploaded: int = 0  # objects uploaded and verified
    uploaded_bytes: int = 0
    downloaded: int = 0  # objects downloaded and verified
    downloaded_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def request_retries(self) -> int:
        """HTTP requests botocore sent again (throttling, 5xx, dropped connections)."""
        return max(0, self.attempts - self.calls)

    @property
    def retries(self) -> int:
        return self.request_retries + self.op_retries

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


class _Mismatch(Exception):
    """Bytes at the far end differ from what was sent or announced; retried."""


@dataclass(frozen=True)
class RemoteObject:
    size: int
    etag: str
    digest: str | None  # flor's xxh3 from the object metadata, when flor wrote it


def _md5(data: bytes | memoryview) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


class S3Backend:
    """Objects under ``s3://bucket/prefix``; keys are relative POSIX paths below the prefix.

    (needs a bucket and credentials, so the example is not run as a doctest)

    Implements ``flor.store.backend.Backend`` (read, write, exists, list, delete); ``head``,
    ``check``, ``list_sizes`` and ``list_dirs`` are extras the spool uses.

    (needs an S3 bucket, so the example is not run as a doctest)

    >>> s3 = S3Backend("s3://my-bucket/flor")          # doctest: +SKIP
    >>> s3.write("demo/objects/ab/cdef", b"...")        # doctest: +SKIP
    >>> s3.read("demo/objects/ab/cdef")                 # doctest: +SKIP
    b'...'
    """

    def __init__(
        self, url: str, *, max_attempts: int = 8, op_attempts: int = 6, part_size: int = 16 * _MiB,
        multipart_threshold: int = 64 * _MiB, max_pool: int = 16, connect_timeout: float = 10,
        read_timeout: float = 60, backoff_s: float = 0.25,
    ) -> None:
        boto3 = _import_boto3()
        from botocore.config import Config

        self.url = url
        self.bucket, self.prefix = parse_s3_url(url)
        self.part_size = max(5 * _MiB, part_size)  # S3's minimum part size, except the last
        self.multipart_threshold = max(multipart_threshold, self.part_size)
        self.op_attempts = op_attempts
        self.max_pool = max_pool
        self.backoff_s = backoff_s
        self.stats = TransferStats()
        common = dict(
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            # flor checks integrity itself (Content-MD5, ETag, xxh3); asking for the newer
            # flexible checksums only where required keeps S3-compatible servers working
            request_checksum_calculation="when_required", response_checksum_validation="when_required",
        )
        self._rng = random.Random()  # never the global one: that is the training script's RNG state
        session = boto3.session.Session()
        # botocore's own retries are off (one attempt in all); _retry_hook does the same job
        no_retries = {"mode": "standard", "total_max_attempts": 1}
        self.client = session.client("s3", config=Config(retries=no_retries, max_pool_connections=max_pool, **common))
        # the reachability probe gives up fast: a wrong endpoint should fail in seconds, not minutes
        self._probe = session.client("s3", config=Config(retries=no_retries, **common))
        # s3transfer (multipart uploads) sends its requests through self.client, so this hook,
        # and with it the private RNG, covers the parts it uploads in parallel too
        for client, attempts in ((self.client, max_attempts), (self._probe, 2)):
            client.meta.events.register("needs-retry.s3", self._retry_hook(attempts))
        events = self.client.meta.events
        events.register("before-parameter-build.s3.UploadPart", part_md5)  # S3 rejects a damaged part
        events.register("before-call.s3", lambda **_: self.stats.add(calls=1))
        events.register("request-created.s3", lambda **_: self.stats.add(attempts=1))

    @property
    def endpoint(self) -> str:
        """The endpoint as errors name it: a password in its URL (``http://user:pw@host``) or query hidden."""
        return redact_text(str(self.client.meta.endpoint_url))

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def where(self, rel: str = "") -> str:
        return f"s3://{self.bucket}/{self.key(rel)}" if rel else f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    # -- the Backend verbs, and extras -------------------------------------------------

    def check(self) -> None:
        """Fail with one clear StorageError when the endpoint, bucket or credentials are wrong."""
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError

        for attempt in range(3):
            try:
                self._probe.list_objects_v2(Bucket=self.bucket, Prefix=self.key(""), MaxKeys=1)
                return
            except (EndpointConnectionError, ConnectTimeoutError) as exc:
                raise self._translate(exc, "check", "") from exc
            except Exception as exc:  # sorted by _transient, translated below
                if attempt == 2 or not _transient(exc):
                    raise self._translate(exc, "check", "") from exc
                time.sleep(self.backoff_s * (2 ** attempt) * (0.5 + self._rng.random()))

    def write(self, rel: str, data: bytes | memoryview, *, digest: str | None = None) -> None:
        """Upload ``data`` to ``rel`` and return once S3 shows exactly those bytes there."""
        digest = digest or hash_bytes(data)
        view = memoryview(data).cast("B")

        def attempt() -> None:
            if len(view) >= self.multipart_threshold:
                etag = self._put_multipart(rel, view, digest)
            else:
                md5 = _md5(view)
                self.client.put_object(
                    Bucket=self.bucket, Key=self.key(rel), ContentLength=len(view),
                    Body=data if isinstance(data, bytes) else bytes(view),
                    ContentMD5=base64.b64encode(md5).decode(), Metadata={META_HASH: digest},
                )
                etag = md5.hex()
            self._verify(rel, len(view), digest, etag, view)

        self._retry(attempt, "upload", rel)
        self.stats.add(uploaded=1, uploaded_bytes=len(view))

    def head(self, rel: str) -> RemoteObject | None:
        """Size, ETag and flor hash of ``rel``, or None when there is no such object."""

        def attempt() -> RemoteObject | None:
            from botocore.exceptions import ClientError

            try:
                r = self.client.head_object(Bucket=self.bucket, Key=self.key(rel))
            except ClientError as exc:
                if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                    return None
                raise
            return RemoteObject(int(r["ContentLength"]), r.get("ETag", "").strip('"'), _meta_hash(r))

        return self._retry(attempt, "look-up", rel)

    def exists(self, rel: str) -> bool:
        return self.head(rel) is not None

    def read(self, rel: str, *, digest: str | None = None, limit: int | None = None) -> bytes:
        """The bytes of ``rel``, checked against ``digest`` (or the hash in its metadata).

        A bucket is untrusted: an object larger than ``limit`` (default ``read_limit()``: half
        the memory available now) is refused before its body is read, and no more bytes than
        the object announced are ever read, so a planted huge object cannot take the memory a
        replay needs."""
        limit = read_limit() if limit is None else limit

        def attempt() -> bytes:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key(rel))
            size = int(r["ContentLength"])
            if size > limit:
                r["Body"].close()
                raise StorageError(f"{self.where(rel)} is {size} bytes, more than the {limit} this machine can "
                                   "take now (half its available memory): not downloaded; a flor object that "
                                   "large is not one this spool should hold (check who writes to it)")
            data = r["Body"].read(size + 1)
            if len(data) != int(r["ContentLength"]):
                raise _Mismatch(f"got {len(data)} bytes of {r['ContentLength']}")
            expected = digest or _meta_hash(r)
            if expected and hash_bytes(data) != expected:
                raise _Mismatch(f"the bytes hash to {hash_bytes(data)}, not {expected}")
            etag = r.get("ETag", "").strip('"')
            if not expected and re.fullmatch(r"[0-9a-f]{32}", etag) and _md5(data).hex() != etag:
                raise _Mismatch(f"the bytes' MD5 is {_md5(data).hex()}, not the ETag {etag}")
            return data

        data = self._retry(attempt, "download", rel)
        self.stats.add(downloaded=1, downloaded_bytes=len(data))
        return data

    def list(self, rel_prefix: str) -> list[str]:
        """Every key that starts with ``rel_prefix``, sorted."""
        return [key for key, _ in self.list_sizes(rel_prefix)]

    def list_sizes(self, rel_prefix: str) -> builtins.list[tuple[str, int]]:  # `list` is the method above here
        """``(key, size)`` of every object whose key starts with ``rel_prefix``, sorted."""

        def attempt() -> builtins.list[tuple[str, int]]:
            out: builtins.list[tuple[str, int]] = []
            strip = len(self.key(""))
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self.key(rel_prefix)):
                out.extend((o["Key"][strip:], int(o["Size"])) for o in page.get("Contents", ()))
            return sorted(out)

        return self._retry(attempt, "listing", rel_prefix)

    def list_dirs(self, rel_prefix: str) -> builtins.list[str]:
        """The names of the 'folders' directly under ``rel_prefix`` (which ends with '/')."""

        def attempt() -> builtins.list[str]:
            out: builtins.list[str] = []
            strip = len(self.key(rel_prefix))
            for page in self.client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=self.key(rel_prefix), Delimiter="/"):
                out.extend(p["Prefix"][strip:].rstrip("/") for p in page.get("CommonPrefixes", ()))
            return sorted(out)

        return self._retry(attempt, "listing", rel_prefix)

    def delete(self, rel: str) -> None:
        self._retry(lambda: self.client.delete_object(Bucket=self.bucket, Key=self.key(rel)), "delete", rel)

    # -- internals ---------------------------------------------------------------------

    def _put_multipart(self, rel: str, view: memoryview, digest: str) -> str:
        """Upload in parts, several at once (``flor.store.s3parts``); return the expected ETag."""
        from .s3parts import upload_multipart

        try:
            return upload_multipart(self.client, self.bucket, self.key(rel), view, metadata={META_HASH: digest},
                                    part_size=self.part_size, threshold=self.multipart_threshold,
                                    concurrency=max(1, self.max_pool - 2))
        except Exception as exc:
            if _code(exc) != "NoSuchUpload":
                raise
            # a resent completion whose first answer was lost: it is complete, _verify checks
            return multipart_etag(view, self.part_size)

    def _verify(self, rel: str, size: int, digest: str, etag: str, data: memoryview) -> None:
        """Raise ``_Mismatch`` unless S3 holds ``size`` bytes under ``rel`` with flor's hash and
        an MD5 ETag that fits. Some S3-compatible servers give a multipart object the plain
        MD5 of its bytes rather than S3's MD5 of the parts' MD5s: both are accepted."""

        def whole_md5() -> str:
            return etag if "-" not in etag else _md5(data).hex()

        obj = self.head(rel)
        problem = None
        if obj is None:
            problem = "the object is not there after the upload"
        elif obj.size != size:
            problem = f"S3 holds {obj.size} bytes, {size} were sent"
        elif obj.digest is not None and obj.digest != digest:
            problem = f"its metadata hash is {obj.digest}, expected {digest}"
        elif _MD5_ETAG_RE.match(obj.etag) and obj.etag != etag and obj.etag != whole_md5():
            problem = f"its ETag is {obj.etag}, the bytes sent give {etag}: they were damaged on the way"
        elif obj.digest is None and not _MD5_ETAG_RE.match(obj.etag):
            # a server that keeps neither metadata nor MD5 ETags: read the object back
            if hash_bytes(self.client.get_object(Bucket=self.bucket, Key=self.key(rel))["Body"].read()) != digest:
                problem = "the bytes read back differ from the bytes sent"
        if problem:
            raise _Mismatch(problem)

    def _retry_hook(self, max_attempts: int) -> Callable[..., float | None]:
        """botocore's ``needs-retry`` handler: the delay before the next attempt, or None."""

        def needs_retry(attempts: int, response: Any = None, caught_exception: Any = None, **_: Any) -> float | None:
            if attempts >= max_attempts:
                return None
            if caught_exception is not None:
                if not _transient(caught_exception):
                    return None
                base = 0.05
            elif response is not None:
                status = response[0].status_code
                code = str(((response[1] or {}).get("Error") or {}).get("Code", ""))
                if status == 429 or code in _THROTTLING_CODES:
                    base = 0.5  # throttled: back off for real
                elif status >= 500 or code in _TRANSIENT_CODES:
                    base = 0.05
                else:
                    return None
            else:
                return None
            return min(20.0, base * 2 ** (attempts - 1)) * self._rng.random()

        return needs_retry

    def _retry(self, fn: Callable[[], T], action: str, rel: str) -> T:
        for attempt in range(self.op_attempts):
            try:
                return fn()
            except StorageError:
                raise  # already translated (a look-up inside this operation gave up)
            except Exception as exc:  # sorted by _transient, translated below
                if isinstance(exc, _Mismatch):
                    self.stats.add(verify_failures=1)
                if attempt == self.op_attempts - 1 or not _transient(exc):
                    raise self._translate(exc, action, rel) from exc
                self.stats.add(op_retries=1)
                time.sleep(min(10.0, self.backoff_s * (2 ** attempt)) * (0.5 + self._rng.random()))
        raise AssertionError("unreachable")  # pragma: no cover

    def _translate(self, exc: BaseException, action: str, rel: str) -> StorageError:
        """The one place where botocore errors become flor errors. No credential is ever shown: not
        even one written into the endpoint URL, which botocore's own messages repeat."""
        return StorageError(redact_text(str(self._translated(exc, action, rel))))

    def _translated(self, exc: BaseException, action: str, rel: str) -> StorageError:
        from botocore.exceptions import (
            ClientError, ConnectionError, HTTPClientError, IncompleteReadError, NoCredentialsError,
            PartialCredentialsError,
        )

        where = self.where(rel) if rel else self.where()
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            return StorageError(
                f"no AWS credentials found for {self.where()}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run where an instance role applies"
            )
        if isinstance(exc, ConnectionError):
            return StorageError(
                f"cannot reach the S3 endpoint {self.endpoint} for {self.where()} ({type(exc).__name__}): "
                "check AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL) and the network, then run again"
            )
        if isinstance(exc, (HTTPClientError, IncompleteReadError)):
            return StorageError(
                f"S3 {action} of {where} failed: the connection to {self.endpoint} kept breaking "
                f"({type(exc).__name__}); run again when the network is stable"
            )
        if isinstance(exc, ClientError):
            code, status = _code(exc), _status(exc)
            message = (exc.response.get("Error") or {}).get("Message") or ""
            if code == "NoSuchBucket" or (action == "check" and code in ("404", "NotFound")):
                return StorageError(
                    f"S3 bucket {self.bucket!r} does not exist at {self.endpoint}: create it "
                    f"(aws s3 mb s3://{self.bucket}) or fix the spool URL {self.url}"
                )
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                        "AuthorizationHeaderMalformed", "InvalidClientTokenId", "TokenRefreshRequired"):
                return StorageError(
                    f"S3 at {self.endpoint} rejected the AWS credentials for bucket {self.bucket!r} ({code}): "
                    "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
                )
            if code in ("AccessDenied", "403", "AllAccessDisabled"):
                return StorageError(
                    f"access to {where} was denied ({code}): the credentials need s3:ListBucket, "
                    "s3:GetObject and s3:PutObject on it (s3:DeleteObject is never needed)"
                )
            if code in ("NoSuchKey", "404", "NotFound"):
                return StorageError(f"{where} is missing from the spool")
            return StorageError(f"S3 {action} of {where} failed: {code} {message} (HTTP {status}); run again later")
        if isinstance(exc, _Mismatch):
            return StorageError(f"S3 {action} of {where} failed verification {self.op_attempts} times: {exc}")
        return StorageError(f"S3 {action} of {where} failed: {type(exc).__name__}: {exc}")


def read_limit() -> int:
    """The most bytes one S3 read may bring in: half the memory available now (``MemAvailable``),
    at least 64 MiB; 1 TiB where that cannot be read (not Linux)."""
    try:
        with open("/proc/meminfo", "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    return max(64 << 20, int(line.split()[1]) * 1024 // 2)
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 40


def _meta_hash(response: dict) -> str | None:
    """flor's hash from an object's metadata (some servers change the key's case)."""
    for key, value in (response.get("Metadata") or {}).items():
        if key.lower() == META_HASH:
            return str(value)
    return None


def _code(exc: BaseException) -> str:
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))


def _status(exc: BaseException) -> int:
    return int((getattr(exc, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


_THROTTLING_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
_TRANSIENT_CODES = _THROTTLING_CODES | {
    "RequestTimeout", "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "BadDigest", "IncompleteBody",
    "XAmzContentSHA256Mismatch",
}


def _transient(exc: BaseException) -> bool:
    """Worth another try: throttling, 5xx, a dropped or timed-out connection, damaged bytes."""
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, IncompleteReadError

    if isinstance(exc, (_Mismatch, ConnectionError, HTTPClientError, IncompleteReadError)):
        return True
    if isinstance(exc, ClientError):
        return _code(exc) in _TRANSIENT_CODES or _status(exc) >= 500
    try:
        from urllib3.exceptions import HTTPError as Urllib3Error
    except ImportError:  # pragma: no cover - urllib3 comes with botocore
        return False
    return isinstance(exc, Urllib3Error)
