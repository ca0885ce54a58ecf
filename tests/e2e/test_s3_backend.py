"""The S3 backend against a real S3-compatible server (moto's, on 127.0.0.1), never a mock of
boto3: multipart uploads and downloads survive faults, damaged uploads never count, both
backends speak the same verbs, pulls report through the caller's progress.

The server runs in a subprocess for the module; a ``FaultProxy`` in front of it counts the
requests and, where a test asks, drops, throttles or damages some of them.
"""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="the S3 tests need boto3 and moto[server]: pip install -e '.[test]'")
pytest.importorskip("moto.server", reason="the S3 tests need moto[server]: pip install -e '.[test]'")

from s3server import ACCESS_KEY, REGION, SECRET_KEY, FaultProxy, MotoServer  # noqa: E402

from flor.errors import ConfigError, StorageError  # noqa: E402
from flor.store.hashing import hash_bytes  # noqa: E402


@pytest.fixture(scope="module")
def moto() -> MotoServer:
    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def bucket(moto: MotoServer) -> str:
    name = f"flor-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=name)
    return name


# -- the backend, in process -------------------------------------------------------------


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in dict(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION=REGION,
                           AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                           AWS_EC2_METADATA_DISABLED="true").items():
        monkeypatch.setenv(key, value)


def test_multipart_upload_and_download_survive_faults(moto: MotoServer, bucket: str, aws_env: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from flor.store.s3 import S3Backend

    proxy = FaultProxy(moto.port, drop=0.06, slowdown=0.06, drop_after=0.06, corrupt=0.08, seed=3)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    try:
        s3 = S3Backend(f"s3://{bucket}/p", part_size=5 << 20, multipart_threshold=6 << 20, backoff_s=0.02)
        big = random.Random(0).randbytes(11 << 20)  # three parts: 5 + 5 + 1 MiB
        small = {f"small/{i}": random.Random(i).randbytes(1000 + i) for i in range(12)}
        random.seed(1234)
        script_rng = random.getstate()
        s3.write("big", big)
        for key, data in small.items():
            s3.write(key, data)
        # retries and their jitter never draw from the global RNG: it is the training script's
        assert random.getstate() == script_rng
        head = moto.client().head_object(Bucket=bucket, Key="p/big")
        assert head["ETag"].strip('"').endswith("-3") and head["ContentLength"] == len(big)
        stored = moto.objects(bucket, "p/")
        assert stored == {"p/big": big, **{f"p/{k}": v for k, v in small.items()}}  # nothing lost or damaged
        assert s3.read("big") == big
        assert all(s3.read(key) == data for key, data in small.items())
        assert s3.list("small/") == sorted(small)
        assert s3.list_sizes("small/") == sorted((k, len(v)) for k, v in small.items())
        assert s3.list_dirs("") == ["small"]
        assert s3.head("nothing") is None
        with pytest.raises(StorageError, match="missing from the spool"):
            s3.read("nothing")
        assert proxy.failed > 0 and s3.stats.retries > 0  # faults happened, and were survived
    finally:
        proxy.stop()


def test_damaged_uploads_never_count_as_uploaded(moto: MotoServer, bucket: str, aws_env: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from flor.store.s3 import S3Backend

    proxy = FaultProxy(moto.port, corrupt=1.0)  # every object body is damaged on the way
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    try:
        s3 = S3Backend(f"s3://{bucket}/p", op_attempts=3, backoff_s=0.01)
        with pytest.raises(StorageError, match="failed verification 3 times: .*damaged on the way"):
            s3.write("blob", b"precious bytes" * 100)
        assert s3.stats.uploaded == 0 and s3.stats.verify_failures == 3
    finally:
        proxy.stop()


def test_multipart_uploads_parts_in_parallel_and_verifies(moto: MotoServer, bucket: str, aws_env: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from flor.store.s3 import S3Backend

    proxy = FaultProxy(moto.port, delay=0.2)  # slow requests: parts sent one at a time would not overlap
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
    try:
        s3 = S3Backend(f"s3://{bucket}/p", part_size=5 << 20, multipart_threshold=6 << 20)
        in_flight, most, lock = [0], [0], threading.Lock()

        def started(**_: object) -> None:
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])

        def ended(**_: object) -> None:
            with lock:
                in_flight[0] -= 1

        s3.client.meta.events.register("before-call.s3.UploadPart", started)
        s3.client.meta.events.register("after-call.s3.UploadPart", ended)
        checked = []
        verify = s3._verify
        monkeypatch.setattr(s3, "_verify", lambda *a: (checked.append(a[:4]), verify(*a))[1])
        big = random.Random(1).randbytes(16 << 20)  # above the threshold: four parts of 5, 5, 5, 1 MiB
        s3.write("big", big)
        parts = [p for p in proxy.puts if p.endswith("/p/big")]
        assert len(parts) == 4 and most[0] >= 2  # in parts, several at once
        head = moto.client().head_object(Bucket=bucket, Key="p/big")
        assert head["ETag"].strip('"').endswith("-4") and head["ContentLength"] == len(big)
        assert checked and checked[0][1:3] == (len(big), hash_bytes(big)) and checked[0][3].endswith("-4")
        assert s3.stats.uploaded == 1 and s3.stats.verify_failures == 0
        assert moto.objects(bucket, "p/") == {"p/big": big}
        assert not moto.client().list_multipart_uploads(Bucket=bucket).get("Uploads")  # none left open
    finally:
        proxy.stop()


def test_both_backends_speak_the_same_verbs(moto: MotoServer, bucket: str, aws_env: None, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from flor.store.backend import Backend, open_backend
    from flor.store.local import LocalBackend
    from flor.store.s3 import S3Backend

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto.endpoint)
    local, s3 = open_backend(tmp_path / "store"), open_backend(f"s3://{bucket}/team")
    assert type(local) is LocalBackend and type(s3) is S3Backend
    assert type(open_backend(f"file://{tmp_path}/other")) is LocalBackend
    with pytest.raises(ConfigError, match="gs"):
        open_backend("gs://bucket/x")
    for backend in (local, s3):
        assert isinstance(backend, Backend)
        assert not backend.exists("runs/r/a.json") and backend.list("runs/") == []
        backend.write("runs/r/a.json", b"{}")
        backend.write("runs/r/logs/b.jsonl", memoryview(b"line\n"))
        backend.write("objects/ab/cd", b"blob")
        assert backend.read("runs/r/a.json") == b"{}" and backend.read("runs/r/logs/b.jsonl") == b"line\n"
        assert backend.exists("objects/ab/cd")
        assert backend.list("runs/") == ["runs/r/a.json", "runs/r/logs/b.jsonl"]
        backend.delete("runs/r/a.json")
        backend.delete("runs/r/a.json")  # gone already: not an error
        assert not backend.exists("runs/r/a.json") and backend.list("runs/") == ["runs/r/logs/b.jsonl"]
        with pytest.raises(StorageError, match="missing"):
            backend.read("runs/r/a.json")
    assert sorted(moto.objects(bucket, "team/")) == ["team/objects/ab/cd", "team/runs/r/logs/b.jsonl"]


def test_an_object_too_large_to_hold_is_refused_before_its_body(moto: MotoServer, bucket: str, aws_env: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted object in a bucket is untrusted: one larger than the read limit is refused
    from its announced size, with one line, and never read into memory."""
    from flor.store.s3 import S3Backend, read_limit

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto.endpoint)
    s3 = S3Backend(f"s3://{bucket}/p", op_attempts=2, backoff_s=0.01)
    data = random.Random(1).randbytes(3000)
    s3.write("objects/ab/big", data)
    with pytest.raises(StorageError, match="is 3000 bytes, more than the 1000 this machine can take now"):
        s3.read("objects/ab/big", limit=1000)
    assert s3.read("objects/ab/big", limit=3000) == data and s3.read("objects/ab/big") == data
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 64 << 20 <= read_limit() <= max(64 << 20, physical // 2)


def test_pull_reports_through_the_callers_progress_and_prints_nothing(
        moto: MotoServer, bucket: str, aws_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture) -> None:
    from flor.store import ExperimentStore
    from flor.store.sync import RemoteBlobs, Spooler, find_spooled_run, open_spool, pull_run

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto.endpoint)
    url = f"s3://{bucket}/flor"
    home = ExperimentStore(tmp_path / "a", "demo")
    run = "20260101T000000.000001-aaaaaa"
    digests = [home.blobs.put(bytes([i]) * 100)[0] for i in range(3)]
    from flor.store.manifest import seal  # a manifest that validates: three bytes leaves, a bare RNG state

    rng = {"t": "dict", "k": ["python", "numpy", "torch"], "v": [None, None, None]}
    home.write_json(home.manifest_key(run, "train", 0, 0), seal({
        "block": "train", "epoch": 0, "occurrence": 0, "count": 3, "rng": rng,
        "objects": {"t": "list", "v": [{"t": "bytes", "h": d} for d in digests]}}))
    home.write_json(home.run_key(run, "run.json"), {"format": 2, "name": "demo", "run": run, "status": "finished"})
    spooler = Spooler(home, url, workers=2)
    spooler.spool()
    assert spooler.counts.uploaded == 5 and not spooler.failures

    bars: list[list] = []

    class Bar:
        def __init__(self, total: int, label: str) -> None:
            bars.append([label, total, 0, False])

        def update(self, n: int = 1) -> None:
            bars[-1][2] += n

        def close(self) -> None:
            bars[-1][3] = True

    fresh = ExperimentStore(tmp_path / "b", "demo")
    assert find_spooled_run(fresh, url, "2026") == run  # the one run picker, over local and spooled runs
    remote = open_spool(url)
    fetcher = RemoteBlobs(fresh, remote, progress=Bar)
    assert pull_run(fresh, remote, run, fetcher=fetcher, progress=Bar) == 2
    assert bars == [[f"pulling run {run} metadata", 1, 1, True], [f"fetching 3 blobs of run {run}", 3, 3, True]]
    assert fresh.resolve_run(None) == run and all(fresh.blobs.get(d) == bytes([i]) * 100 for i, d in enumerate(digests))
    assert fetcher.summary() is not None and fetcher.summary().startswith("fetched 3 blobs (300 B)")
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # the store never prints: the caller decides what people see
