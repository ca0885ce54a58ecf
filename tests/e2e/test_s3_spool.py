"""S3 spooling of real recordings against a real S3-compatible server (moto's, on 127.0.0.1),
never a mock of boto3: spooled while recording or after, replayed on fresh machines, faults and
kills survived, errors one clear line.

The server runs in a subprocess for the module; a ``FaultProxy`` in front of it counts the
requests and, where a test asks, drops, throttles or damages some of them.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("boto3", reason="the S3 tests need boto3 and moto[server]: pip install -e '.[test]'")
pytest.importorskip("moto.server", reason="the S3 tests need moto[server]: pip install -e '.[test]'")

from helpers import Runner, values  # noqa: E402
from s3server import ACCESS_KEY, SECRET_KEY, FaultProxy, MotoServer, free_port, s3_env  # noqa: E402

from flor.store.hashing import hash_bytes  # noqa: E402

EPOCHS = "4"
PROBE = {"    # OUTER": "    flor.log('w_norm', net[0].weight.norm().item())\n    # OUTER"}


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


def flor_cli(runner: Runner, env: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "flor", *args], cwd=runner.cwd, env=env,
                          capture_output=True, text=True, timeout=180)
    if check and proc.returncode != 0:
        raise AssertionError(f"flor {args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def logs(runner: Runner, env: dict, name: str = "toy") -> list[dict]:
    out = flor_cli(runner, env, "logs", name)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def tree(home: Path, sub: str = "") -> dict[str, bytes]:
    """Files under ``home`` (keys relative to it), without the spool journals."""
    base = home / sub
    return {p.relative_to(home).as_posix(): p.read_bytes() for p in sorted(base.rglob("*"))
            if p.is_file() and "/spool/" not in p.relative_to(home).as_posix()}


def strip(objects: dict[str, bytes], prefix: str) -> dict[str, bytes]:
    return {k[len(prefix):]: v for k, v in objects.items()}


def manifest_hashes(data: bytes) -> set[str]:
    from flor.store.experiment import blob_hashes

    return blob_hashes(json.loads(data))


def summary_numbers(text: str) -> dict[str, int]:
    """The counts in flor's 'N objects verified ... R retries (...)' line."""
    m = re.search(r"(\d+) objects verified .*?\((\d+) uploaded.*?(\d+) found there already\), (\d+) skipped "
                  r".*?(\d+) retries \((\d+) requests resent, (\d+) operations repeated, (\d+) failed verification",
                  text)
    assert m, text
    keys = ["verified", "uploaded", "present", "skipped", "retries", "resent", "repeated", "verify_failures"]
    return dict(zip(keys, map(int, m.groups())))


# -- record, evict, replay on fresh machines ---------------------------------------------


def test_spool_during_record_then_replay_on_fresh_machines(runner: Runner, moto: MotoServer, bucket: str,
                                                           tmp_path: Path) -> None:
    proxy = FaultProxy(moto.port)  # no faults: it counts what goes up
    url = f"s3://{bucket}/team/flor"
    env = s3_env(runner, proxy.endpoint, url)
    script = runner.script("toy.py")
    rec = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, env=env)
    assert "flor: spooled run" in rec.stderr, rec.stderr

    # the bucket holds the experiment byte for byte: blobs, manifests, source, logs, TensorBoard, run.json
    remote = strip(moto.objects(bucket, "team/flor/"), "team/flor/")
    local = tree(runner.home)
    assert remote == local
    [run] = os.listdir(runner.home / "toy" / "runs")
    assert {f"toy/runs/{run}/run.json", f"toy/runs/{run}/logs/record.jsonl", f"toy/runs/{run}/stdout.log"} <= set(remote)
    assert any("/tb/" in k for k in remote) and any("/source/" in k for k in remote)
    # each blob went up exactly once, although consecutive epochs share some of them
    blob_puts = [p for p in proxy.puts if "/objects/" in p]
    local_blobs = {k: v for k, v in local.items() if k.startswith("toy/objects/")}
    assert len(blob_puts) == len(set(blob_puts)) == len(local_blobs)
    # credentials are never written down
    assert not [k for k, v in tree(runner.home).items() if SECRET_KEY.encode() in v]
    assert SECRET_KEY not in rec.stdout + rec.stderr

    # the baseline: a local replay with a hindsight probe
    probe = runner.script("toy.py", edits=PROBE, dest="toy_probe.py")
    runner.run(probe, "--flor", "toy", "--epochs", EPOCHS, "--replay_flor")
    base = values(runner.logs("toy"), "replay")
    assert {k for k in base if k[0] == "w_norm"} == {("w_norm", e, None) for e in range(4)}

    # a worker on a fresh machine (empty FLOR_HOME, only FLOR_SPOOL) replays its segment, through
    # a network that drops, throttles or damages one request in five
    faulty = FaultProxy(moto.port, drop=0.05, slowdown=0.05, drop_after=0.05, corrupt=0.05, seed=5)
    fresh = tmp_path / "fresh"
    fresh_env = s3_env(runner, faulty.endpoint, url, FLOR_HOME=str(fresh))
    seg = runner.run(probe, "--flor", "toy", "--epochs", EPOCHS, "--replay_flor", "1/2", env=fresh_env)
    faulty.stop()
    assert "replay verified exact" in seg.stderr, seg.stderr
    got = values(logs(runner, fresh_env), "replay")
    assert got == {k: v for k, v in base.items() if k[1] in (2, 3)}  # bit-identical to the local replay
    fetched = tree(fresh, "toy/objects")
    assert fetched and all(local_blobs[k] == v for k, v in fetched.items())  # zero lost or damaged
    fetch = re.search(r"fetched (\d+) blobs .*?, (\d+) retries", seg.stderr)
    assert fetch and int(fetch.group(1)) == len(fetched), seg.stderr
    print("fault injection, replay from S3:", json.dumps({
        "proxy": dict(faulty.counts), "requests_failed": faulty.failed, "blobs_fetched_and_verified": len(fetched),
        "flor_retries": int(fetch.group(2))}))
    assert faulty.failed > 0 and int(fetch.group(2)) > 0
    # its logs went back to the spool, beside the recording
    assert [k for k in strip(moto.objects(bucket, f"team/flor/toy/runs/{run}/logs/"), "")
            if re.search(r"/replay-.*-1\.jsonl$", k)]

    # evict: local blobs go, manifests and logs stay; a pull on a third machine brings them back intact
    out = flor_cli(runner, env, "spool", "toy", "--evict")
    assert f"evicted {len(local_blobs)} local blobs" in out.stdout, out.stdout
    assert not tree(runner.home, "toy/objects") and tree(runner.home, f"toy/runs/{run}/checkpoints")
    pulled = tmp_path / "pulled"
    out = flor_cli(runner, s3_env(runner, proxy.endpoint, url, FLOR_HOME=str(pulled)), "pull", "toy")
    assert f"{len(local_blobs)} blobs fetched" in out.stdout, out.stdout
    assert tree(pulled, "toy/objects") == local_blobs
    assert tree(pulled, f"toy/runs/{run}/checkpoints") == tree(runner.home, f"toy/runs/{run}/checkpoints")
    proxy.stop()


def test_spool_after_the_fact_resumes_after_a_kill(runner: Runner, moto: MotoServer, bucket: str,
                                                  tmp_path: Path) -> None:
    script = runner.script("toy.py")
    # a recording whose spool target is wrong trains and records all the same, and says so
    wrong = "s3://no-such-bucket-here/flor"
    first = runner.run(script, "--flor", "toy", "--epochs", "2", env=s3_env(runner, moto.endpoint, wrong))
    assert "epoch 1 acc" in first.stdout and len(values(runner.logs("toy"), "record")) == 6
    assert "does not exist" in first.stderr and "`flor spool toy" in first.stderr, first.stderr
    # a replay on an empty machine with that target says what is wrong, in one line, at `import flor`
    importer = tmp_path / "imports_flor.py"
    importer.write_text("import flor\nprint('the script ran')\n")
    fresh_env = s3_env(runner, moto.endpoint, wrong, FLOR_HOME=str(tmp_path / "fresh"))
    rep = runner.run(importer, "--flor", "toy", "--replay_flor", env=fresh_env, check=False)
    assert rep.returncode == 2 and rep.stdout == "" and rep.stderr.strip().splitlines() == [
        f"flor: error: S3 bucket 'no-such-bucket-here' does not exist at {moto.endpoint}: create it "
        f"(aws s3 mb s3://no-such-bucket-here) or fix the spool URL {wrong}"]

    # a second recording without a spool: the same tensors, so the same blobs (the failed spool
    # did not disturb training), stored once
    runner.run(script, "--flor", "toy", "--epochs", "2", env=runner.env(FLOR_EVERY="1"))
    runs = sorted(os.listdir(runner.home / "toy" / "runs"))
    local = tree(runner.home)
    digests = [[json.loads(v)["digest"] for k, v in sorted(local.items()) if f"{run}/checkpoints/" in k] for run in runs]
    assert len(digests[0]) == 2 and digests[0] == digests[1]
    local_blobs = [k for k in local if k.startswith("toy/objects/")]
    url = f"s3://{bucket}/flor"

    slow = FaultProxy(moto.port, delay=0.05)
    proc = subprocess.Popen([sys.executable, "-m", "flor", "spool", "toy", url, "--workers", "1"], cwd=runner.cwd,
                            env=s3_env(runner, slow.endpoint), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal_lines = 0
    deadline = time.monotonic() + 90
    while journal_lines < 13 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        journal = glob.glob(str(runner.home / "toy" / "spool" / "*.jsonl"))
        journal_lines = len(Path(journal[0]).read_text().splitlines()) if journal else 0
    assert proc.poll() is None, "the spool finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    slow.stop()
    journaled = {json.loads(line)["k"] for line in Path(journal[0]).read_text().splitlines()[1:]
                 if line.endswith("}")}
    assert len(journaled) >= 12

    # what the kill left is consistent: a manifest is there only with all its blobs; run.json goes last
    partial = strip(moto.objects(bucket, "flor/"), "flor/")
    assert len(partial) < len(local)
    for key, data in partial.items():
        if "/checkpoints/" in key:
            assert {f"toy/objects/{h[:2]}/{h[2:]}" for h in manifest_hashes(data)} <= set(partial)
        assert local[key] == data

    fast = FaultProxy(moto.port)
    out = flor_cli(runner, s3_env(runner, fast.endpoint, url), "spool", "toy")  # FLOR_SPOOL is the target
    fast.stop()
    counts = summary_numbers(out.stdout)
    assert counts["skipped"] >= len(journaled)
    resent = {p.split(f"/{bucket}/flor/", 1)[1] for p in fast.puts} & {f"toy/{k}" for k in journaled}
    assert not resent  # nothing verified before the kill went up again
    blob_puts = [p for p in slow.puts + fast.puts if "/objects/" in p]
    assert len(blob_puts) == len(set(blob_puts)) == len(local_blobs)  # once each, across both runs
    assert strip(moto.objects(bucket, "flor/"), "flor/") == local

    again = flor_cli(runner, s3_env(runner, moto.endpoint, url), "spool", "toy")  # nothing left to do
    assert summary_numbers(again.stdout)["verified"] == 0 and summary_numbers(again.stdout)["skipped"] >= len(local)


def test_upload_faults_lose_nothing(runner: Runner, moto: MotoServer, bucket: str) -> None:
    proxy = FaultProxy(moto.port, drop=0.04, slowdown=0.05, drop_after=0.04, corrupt=0.05, seed=11)
    url = f"s3://{bucket}/flor"
    script = runner.script("toy.py")
    # FLOR_SPOOL_BUDGET=0: every local blob is evicted as soon as its upload is verified
    env = s3_env(runner, proxy.endpoint, url, FLOR_SPOOL_BUDGET="0")
    rec = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, env=env)
    up = summary_numbers(rec.stderr)
    up_faults = dict(proxy.counts)
    assert "flor: spooled run" in rec.stderr and "FL405" not in rec.stderr, rec.stderr

    # zero objects lost or corrupted: every local file is in S3 as it is here, every blob matches its name
    remote = strip(moto.objects(bucket, "flor/"), "flor/")
    local = tree(runner.home)
    assert not tree(runner.home, "toy/objects")  # all evicted, and only after verification
    assert all(remote[k] == v for k, v in local.items())
    needed = set().union(*(manifest_hashes(v) for k, v in local.items() if "/checkpoints/" in k))
    blobs = {k.rsplit("/", 2)[-2] + k.rsplit("/", 1)[-1]: v for k, v in remote.items() if "/objects/" in k}
    assert needed and needed <= set(blobs) and all(hash_bytes(blobs[h]) == h for h in needed)

    proxy.stop()

    # a later replay here, without FLOR_SPOOL, fetches the evicted blobs from where the run was spooled
    rep = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, "--replay_flor", env=s3_env(runner, moto.endpoint))
    assert f"fetching them from {url}" in rep.stderr and "replay verified exact" in rep.stderr, rep.stderr
    records = runner.logs("toy")
    assert values(records, "replay") == values(records, "record") and len(values(records, "record")) == 12
    assert tree(runner.home, "toy/objects") == {f"toy/objects/{h[:2]}/{h[2:]}": blobs[h] for h in needed}
    print("fault injection, spool during record:", json.dumps({
        "proxy": up_faults, "requests_failed": proxy.failed, "flor": up,
        "objects_checked_in_bucket": len(local) + len(needed)}))
    assert proxy.failed > 0 and up["retries"] > 0 and up["verified"] >= len(local) + len(needed)


def test_blobs_evicted_by_flor_spool_come_back_from_there(runner: Runner, moto: MotoServer, bucket: str,
                                                          tmp_path: Path) -> None:
    """A run spooled after the fact (`flor spool NAME URL --evict`) names no spool in run.json:
    its replay finds the spool in the journal the spooler kept, and, the user having spooled
    there, fetches the evicted blobs without FLOR_SPOOL. Another user's replay of the same
    store does not send its credentials there."""
    url = f"s3://{bucket}/later"
    script = runner.script("toy.py")
    runner.run(script, "--flor", "toy", "--epochs", EPOCHS, env=s3_env(runner, moto.endpoint))
    out = flor_cli(runner, s3_env(runner, moto.endpoint), "spool", "toy", url, "--evict")
    assert "evicted" in out.stdout and not tree(runner.home, "toy/objects"), out.stdout

    other = s3_env(runner, moto.endpoint, FLOR_CONFIG_DIR=str(tmp_path / "someone-else"))
    rep = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, "--replay_flor", env=other)
    assert f"names the spool '{url}' for them, which you never recorded or spooled to" in rep.stderr, rep.stderr
    assert not tree(runner.home, "toy/objects")

    rep = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, "--replay_flor", env=s3_env(runner, moto.endpoint))
    assert f"fetching them from {url}" in rep.stderr and "replay verified exact" in rep.stderr, rep.stderr
    assert tree(runner.home, "toy/objects")
    records = runner.logs("toy")
    assert values(records, "replay") == values(records, "record")


def test_a_planted_spool_url_gets_no_credentials(runner: Runner, moto: MotoServer, bucket: str) -> None:
    """A run.json is anyone's to write: the spool it names is used with this user's credentials
    only if this user recorded to it; otherwise the evicted blobs are not fetched (their blocks
    run again) and one line says how to opt in."""
    url = f"s3://{bucket}/flor"
    script = runner.script("toy.py")
    rec = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, env=s3_env(runner, moto.endpoint, url, FLOR_SPOOL_BUDGET="0"))
    assert "flor: spooled run" in rec.stderr and not tree(runner.home, "toy/objects"), rec.stderr  # all evicted

    theirs = f"flor-{uuid.uuid4().hex[:12]}"  # the attacker's bucket, holding every blob the replay would want
    client = moto.client()
    client.create_bucket(Bucket=theirs)
    for key, data in moto.objects(bucket, "flor/").items():
        client.put_object(Bucket=theirs, Key=key, Body=data)
    (run_json,) = runner.home.glob("toy/runs/*/run.json")
    meta = json.loads(run_json.read_text())
    meta["spool"] = f"s3://{theirs}/flor"
    run_json.write_text(json.dumps(meta))

    rep = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, "--replay_flor", env=s3_env(runner, moto.endpoint))
    assert f"names the spool 's3://{theirs}/flor' for them, which you never recorded or spooled to" in rep.stderr, \
        rep.stderr
    assert "FL407" not in rep.stderr and not tree(runner.home, "toy/objects"), rep.stderr
    records = runner.logs("toy")
    assert values(records, "replay") == values(records, "record"), rep.stderr  # re-executed: still exact

    # the user's own say-so opts in: FLOR_SPOOL names it
    rep = runner.run(script, "--flor", "toy", "--epochs", EPOCHS, "--replay_flor",
                     env=s3_env(runner, moto.endpoint, f"s3://{theirs}/flor"))
    assert rep.returncode == 0 and tree(runner.home, "toy/objects"), rep.stderr


# -- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["missing bucket", "bad credentials", "unreachable endpoint"])
def test_spool_errors_are_one_clear_line(runner: Runner, moto: MotoServer, case: str) -> None:
    run_dir = runner.home / "toy" / "runs" / "20260101T000000.000000-abcdef"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text("{}")
    server = None
    if case == "missing bucket":
        endpoint, url, needle = moto.endpoint, "s3://no-such-bucket-here/flor", "S3 bucket 'no-such-bucket-here' does not exist"
    elif case == "bad credentials":
        server = MotoServer(auth=True).start()  # checks credentials; ours are unknown to it
        endpoint, url, needle = server.endpoint, "s3://some-bucket/flor", "rejected the AWS credentials"
    else:
        port = free_port()
        endpoint, url, needle = f"http://127.0.0.1:{port}", "s3://some-bucket/flor", f"cannot reach the S3 endpoint http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        out = flor_cli(runner, s3_env(runner, endpoint), "spool", "toy", url, check=False)
        took = time.monotonic() - started
    finally:
        if server is not None:
            server.stop()
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
    assert SECRET_KEY not in out.stdout + out.stderr and ACCESS_KEY not in out.stderr
    assert took < 30  # a wrong setup fails fast instead of retrying for minutes
