"""A store you can share (issue #10): data never runs code, every byte of a manifest is verified.

Attacks made as someone with write access to a store or a bucket, on real recordings, real
replays in subprocesses and the suite's real S3-compatible server; the attacks tried are
printed (``pytest -s``) for the issue's note.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import uuid
from pathlib import Path

import pytest

from helpers import Runner, values
from flor.store.hashing import hash_bytes
from flor.store.manifest import canonical_bytes


def attack_refused(what: str) -> None:
    """Said by a test once it has asserted that the attack ``what`` failed: the attacks refused
    are printed (``pytest -s``) for the issue's note."""
    print(f"\nattack refused: {what}")


class Planted:
    """Unpickling this creates ``path``: the marker that code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):  # noqa: ANN204
        return (open, (self.path, "w"))


def manifests(home: Path, name: str) -> list[Path]:
    [run] = (home / name / "runs").iterdir()
    return sorted((run / "checkpoints").rglob("*.json"))


def reseal(manifest: dict) -> dict:
    """What an attacker does after editing a manifest: recompute its checksum (anyone can)."""
    manifest["sha256"] = hashlib.sha256(canonical_bytes(manifest)).hexdigest()
    return manifest


def plant(manifest: dict, payload: bytes, put) -> dict:  # noqa: ANN001
    """Switch the manifest's int leaf (the step counter) to a pickle of ``payload``, stored with
    ``put(key, bytes)`` under its content hash, with a correct SHA-256: as valid as it gets."""
    digest = hash_bytes(payload)
    put(f"objects/{digest[:2]}/{digest[2:]}", payload)
    leaves = manifest["objects"]["v"]
    index = next(i for i, v in enumerate(leaves) if type(v) is int)
    leaves[index] = {"t": "pickle", "h": digest, "cls": "builtins.int", "sha256": hashlib.sha256(payload).hexdigest()}
    return reseal(manifest)


def put_local(home: Path, name: str):  # noqa: ANN201
    def put(key: str, data: bytes) -> None:
        path = home / name / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    return put


def refused(proc, marker: Path, cls: str = "builtins.int") -> None:  # noqa: ANN001
    assert proc.returncode != 0, proc.stderr
    assert not marker.exists(), "the planted pickle ran"
    assert f"pickled {cls}" in proc.stderr and "--flor_trust_pickles" in proc.stderr, proc.stderr
    assert "FLOR_TRUST_PICKLES=1" in proc.stderr and "key" in proc.stderr, proc.stderr


# -- no code from data -------------------------------------------------------------------


def test_a_planted_pickle_runs_no_code_locally(runner: Runner, tmp_path: Path) -> None:
    script = runner.script("toy.py")
    runner.run(script, "--flor", "toy", "--epochs", "2")
    marker = tmp_path / "pwned"
    for path in manifests(runner.home, "toy"):  # every checkpoint: whichever replay reads first
        m = plant(json.loads(path.read_text()), pickle.dumps(Planted(marker)), put_local(runner.home, "toy"))
        path.write_text(json.dumps(m))
    proc = runner.run(script, "--flor", "toy", "--epochs", "2", "--replay_flor", check=False)
    refused(proc, marker)
    assert "not signed" in proc.stderr
    attack_refused("planted pickle, local store")


def test_pickled_leaves_load_with_the_users_key_or_the_opt_in(runner: Runner, tmp_path: Path) -> None:
    script = runner.script("leafy.py")
    key_a = {"FLOR_CONFIG_DIR": str(tmp_path / "a")}
    rec = runner.run(script, "--flor", "leafy", env=runner.env(**key_a))
    assert "collections.Counter, which flor can store only with pickle" in rec.stderr
    assert rec.stderr.count("only with pickle") == 1  # once per type, not per checkpoint
    key = tmp_path / "a" / "key"
    assert key.stat().st_mode & 0o777 == 0o600
    recorded = values(runner.logs("leafy"), "record")
    assert recorded[("mode", 2, None)] == "EVAL" and recorded[("count", 2, None)] == 12

    # the recording user's own key: the signed pickles load, no opt-in
    mine = runner.run(script, "--flor", "leafy", "--replay_flor", env=runner.env(**key_a))
    assert "replay verified exact" in mine.stderr and "3 blocks restored" in mine.stderr, mine.stderr
    # a colleague with another key: refused, and told both ways to allow it
    key_b = {"FLOR_CONFIG_DIR": str(tmp_path / "b")}
    (tmp_path / "b").mkdir(mode=0o700)
    (tmp_path / "b" / "key").write_text(os.urandom(32).hex())
    os.chmod(tmp_path / "b" / "key", 0o600)
    other = runner.run(script, "--flor", "leafy", "--replay_flor", env=runner.env(**key_b), check=False)
    assert other.returncode != 0 and "signed with another key" in other.stderr, other.stderr
    assert "--flor_trust_pickles" in other.stderr and str(tmp_path / "b" / "key") in other.stderr
    attack_refused("HMAC made with another key")
    # ... who opts in: loads them, and the replay is exact
    trusting = runner.run(script, "--flor", "leafy", "--replay_flor", "--flor_trust_pickles", env=runner.env(**key_b))
    assert "replay verified exact" in trusting.stderr and "3 blocks restored" in trusting.stderr, trusting.stderr

    # a pickle planted in a signed manifest (its HMAC kept) is refused even with the right key
    marker = tmp_path / "pwned"
    path = manifests(runner.home, "leafy")[0]
    m = plant(json.loads(path.read_text()), pickle.dumps(Planted(marker)), put_local(runner.home, "leafy"))
    path.write_text(json.dumps(m))
    proc = runner.run(script, "--flor", "leafy", "--replay_flor", env=runner.env(**key_a), check=False)
    refused(proc, marker, "collections.Counter")  # the first pickled leaf met; the manifest is refused whole
    assert "signature does not match" in proc.stderr, proc.stderr
    attack_refused("planted pickle in a signed manifest")


# -- S3 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto():  # noqa: ANN201
    pytest.importorskip("moto.server", reason="needs moto[server]: pip install -e '.[test]'")
    from s3server import MotoServer

    server = MotoServer().start()
    yield server
    server.stop()


def test_a_planted_pickle_in_the_bucket_runs_no_code(runner: Runner, moto, tmp_path: Path) -> None:  # noqa: ANN001
    from s3server import ACCESS_KEY, REGION, SECRET_KEY

    bucket = f"flor-{uuid.uuid4().hex[:12]}"
    client = moto.client()
    client.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/team"

    def env(**extra: str) -> dict[str, str]:
        out = {k: v for k, v in runner.env(**extra).items() if not k.startswith("AWS_")}
        out.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION=REGION,
                   AWS_ENDPOINT_URL_S3=moto.endpoint, AWS_CONFIG_FILE=os.devnull,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true", FLOR_SPOOL=url)
        return out

    script = runner.script("toy.py")
    runner.run(script, "--flor", "toy", "--epochs", "2", env=env())
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="team/toy/runs/")["Contents"]]
    marker = tmp_path / "pwned"

    def put(key: str, data: bytes) -> None:
        client.put_object(Bucket=bucket, Key=f"team/toy/{key}", Body=data)

    for key in [k for k in keys if "/checkpoints/" in k]:
        m = plant(json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read()),
                  pickle.dumps(Planted(marker)), put)
        client.put_object(Bucket=bucket, Key=key, Body=json.dumps(m).encode())
    fresh = env(FLOR_HOME=str(tmp_path / "fresh"))  # a colleague's machine: nothing local
    proc = runner.run(script, "--flor", "toy", "--epochs", "2", "--replay_flor", env=fresh, check=False)
    refused(proc, marker)
    attack_refused("planted pickle, S3 bucket, empty FLOR_HOME")


# -- every byte verified -------------------------------------------------------------------

PROBE = {"    # OUTER": "    flor.log('w_norm', net[0].weight.norm().item())\n    # OUTER"}


def replay_values(runner: Runner, replay_id: str) -> dict:
    [run] = (runner.home / "toy" / "runs").iterdir()
    lines = (run / "logs" / f"replay-{replay_id}-0.jsonl").read_text().splitlines()
    return {(r["name"], r["epoch"], r["step"]): r["value"] for r in map(json.loads, lines)}


def test_a_flipped_inline_value_is_detected(runner: Runner) -> None:
    runner.script("toy.py")
    runner.run(runner.cwd / "toy.py", "--flor", "toy", "--epochs", "3")
    probe = runner.script("toy.py", edits=PROBE, dest="probe.py")
    runner.run(probe, "--flor", "toy", "--epochs", "3", "--replay_flor", env=runner.env(FLOR_REPLAY_ID="clean"))
    clean = replay_values(runner, "clean")

    path = manifests(runner.home, "toy")[1]  # epoch 1
    m = json.loads(path.read_text())
    step = next(i for i, v in enumerate(m["objects"]["v"]) if type(v) is int)
    m["objects"]["v"][step] += 1  # the step counter: the last object given to end(); checksum untouched
    path.write_text(json.dumps(m))

    proc = runner.run(probe, "--flor", "toy", "--epochs", "3", "--replay_flor", env=runner.env(FLOR_REPLAY_ID="flip"))
    assert f"checkpoint manifest {path} was changed after it was written" in proc.stderr, proc.stderr
    assert "re-executes that epoch from the nearest earlier checkpoint" in proc.stderr
    assert replay_values(runner, "flip") == clean  # the hindsight values of a full re-execution
    assert values(runner.logs("toy"), "record")[("step", 1, None)] == clean[("step", 1, None)]
    strict = runner.run(probe, "--flor", "toy", "--epochs", "3", "--replay_flor", "--flor_strict", check=False)
    assert strict.returncode != 0 and str(path) in strict.stderr and "--flor_strict" in strict.stderr
    attack_refused("flipped inline value")
