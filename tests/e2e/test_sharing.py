"""A store you can share (issue #10): names from a store never escape it, secrets never enter it,
and ``flor verify`` finds every damaged byte. Each test attacks as someone with write access to a
store or bucket would, on real files, real subprocesses and the suite's moto S3 server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Runner, git_repo

from flor.store import BlobStore, LocalBackend
from flor.store.ids import HASH_HEX_LEN

#: the attacks this file tries, each listed as its test reaches it (nothing reports them: a
#: name for each, to read here or in a debugger)
ATTACKS: list[str] = []


def files_outside(root: Path, *skip: Path) -> dict[str, bytes]:
    """Every file under ``root`` but not under any of ``skip`` (the stores), with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and not any(s in p.parents for s in skip)}


# -- replay of a tampered store ---------------------------------------------------------------------

def _manifests(runner: Runner, name: str = "toy") -> list[Path]:
    return sorted((runner.home / name / "runs").glob("*/checkpoints/*/*.json"))


def _reseal(manifest: dict) -> dict:
    """What an attacker does after editing a manifest: recompute its checksum (anyone can)."""
    if "sha256" in manifest:
        from flor.store.manifest import seal

        manifest.pop("sha256")
        seal(manifest)
    return manifest


def test_replay_of_a_manifest_naming_a_path_touches_nothing_outside(runner: Runner) -> None:
    ATTACKS.append("manifest leaf h=../../../../canary, replayed")
    script = runner.script()
    runner.run(script, "--flor", "toy", "--epochs", "2")
    canary = runner.cwd / "canary.txt"
    canary.write_text("canary")
    for path in _manifests(runner):
        manifest = json.loads(path.read_text())
        # from home/toy/objects/<h[:2]>/<h[2:]>: up to home/toy, home, tmp_path
        stack = [manifest["objects"]]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                if "h" in node:
                    node["h"] = "../../../../canary.txt"
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        path.write_text(json.dumps(_reseal(manifest)))
    before = files_outside(runner.cwd, runner.home)
    proc = runner.run(script, "--flor", "toy", "--epochs", "2", "--replay_flor", check=False)
    assert canary.read_text() == "canary"
    assert files_outside(runner.cwd, runner.home) == before
    assert "'../../../../canary.txt'" in proc.stderr, proc.stderr  # the error names the planted value


# -- flor verify ------------------------------------------------------------------------------------

def _verify(runner: Runner, *args: str) -> subprocess.CompletedProcess:
    return runner.flor("verify", "toy", *args, check=False)


def _age(path: Path, seconds: float = 3 * 24 * 3600) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_verify_finds_each_damage_and_repair_removes_only_leftovers(runner: Runner) -> None:
    script = runner.script()
    runner.run(script, "--flor", "toy", "--epochs", "3")
    root = runner.home / "toy"
    clean = _verify(runner)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no problems" in clean.stdout and "3 manifest(s)" in clean.stdout

    # leftovers: a temp file of a dead writer (old), a blob nobody names; a link leading out is never followed
    tmp_file = root / "objects" / ".tmp-deadhost-99999999-0-0123abcd"
    tmp_file.parent.mkdir(exist_ok=True)
    tmp_file.write_bytes(b"half a blob")
    _age(tmp_file)
    orphan, _ = BlobStore(LocalBackend(root)).put(b"nobody names me")
    orphan_path = root / "objects" / orphan[:2] / orphan[2:]
    _age(orphan_path)  # a repair keeps blobs younger than its grace period (a recording may be writing them)
    dry = _verify(runner, "--repair", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"would remove unreferenced blob objects/{orphan[:2]}/{orphan[2:]}" in dry.stdout
    assert "would remove temp file objects/.tmp-deadhost" in dry.stdout
    assert tmp_file.exists() and orphan_path.exists()
    fixed = _verify(runner, "--repair")
    assert fixed.returncode == 0 and "removed unreferenced blob" in fixed.stdout, fixed.stdout
    assert not tmp_file.exists() and not orphan_path.exists()
    again = _verify(runner, "--repair", "--dry-run")
    assert "nothing to repair" in again.stdout and "would remove" not in again.stdout

    # damage: a blob deleted, a byte flipped in another, run.json truncated
    run = next((root / "runs").iterdir())
    blobs = sorted(p for p in (root / "objects").rglob("*") if p.is_file())
    gone, flipped = blobs[0], blobs[1]
    gone.unlink()
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    (run / "run.json").write_bytes((run / "run.json").read_bytes()[:40])
    bad = _verify(runner)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    lines = [line for line in bad.stdout.splitlines() if line.startswith("problem: ")]
    gone_hash = gone.parent.name + gone.name
    assert any("run.json" in line and "not valid JSON" in line for line in lines), lines
    assert any(f"names blob {gone_hash}, which is missing" in line for line in lines), lines
    assert any(flipped.relative_to(root).as_posix() in line and "corrupt" in line for line in lines), lines
    assert f"{len(lines)} problem(s)" in bad.stdout
    # a damaged store's repair removes no blob: a manifest it cannot read might name it
    (root / "runs" / run.name / "checkpoints" / "training_loop" / "1.json").write_text("{")
    orphan2, _ = BlobStore(LocalBackend(root)).put(b"maybe named by the damaged manifest")
    kept = _verify(runner, "--repair")
    assert "unreferenced blob(s): runs/" in kept.stdout and "1.json cannot be read" in kept.stdout, kept.stdout
    assert (root / "objects" / orphan2[:2] / orphan2[2:]).exists() and "removed unreferenced" not in kept.stdout


def test_verify_reports_links_out_and_bad_input(runner: Runner, tmp_path: Path) -> None:
    ATTACKS.append("verify --repair with objects/xx linked outside and a planted non-run folder")
    script = runner.script()
    runner.run(script, "--flor", "toy", "--epochs", "1")
    root = runner.home / "toy"
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / ("0" * (HASH_HEX_LEN - 2))
    victim.write_bytes(b"precious")
    _age(victim)
    (root / "objects" / "00").symlink_to(outside, target_is_directory=True)
    (root / "runs" / "..evil").mkdir()
    out = _verify(runner, "--repair")
    assert out.returncode == 1
    assert "objects/00: a symbolic link leading out of the store" in out.stdout
    assert "runs/..evil: not a run id" in out.stdout
    assert victim.read_bytes() == b"precious"
    unknown = runner.flor("verify", "nosuch", check=False)
    assert unknown.returncode == 2 and unknown.stderr.startswith("flor: error: no experiment 'nosuch'")
    assert runner.flor("verify", "../x", check=False).returncode == 2


# -- a bucket with planted keys ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def moto():
    pytest.importorskip("boto3", reason="the S3 tests need boto3 and moto[server]: pip install -e '.[test]'")
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server]: pip install -e '.[test]'")
    from s3server import MotoServer

    server = MotoServer().start()
    yield server
    server.stop()


@pytest.fixture
def bucket(moto) -> str:
    import uuid

    name = f"flor-{uuid.uuid4().hex[:12]}"
    moto.client().create_bucket(Bucket=name)
    return name


def _s3_env(runner: Runner, moto, url: str, home: Path | None = None) -> dict[str, str]:
    from s3server import s3_env

    env = s3_env(runner, moto.endpoint, url)
    if home is not None:
        env["FLOR_HOME"] = str(home)
    return env


def _cli(runner: Runner, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flor", *args], cwd=runner.cwd, env=env, capture_output=True,
                          text=True, timeout=180)


PLANTED = {  # key below the run's prefix -> why it must never be written
    "../../../../evil-dotdot.txt": "'..' up to the folder above FLOR_HOME",
    "logs/..\\..\\..\\..\\..\\evil-backslash.txt": "backslashes",
    "/tmp-evil-absolute.txt": "an absolute path after the prefix",
    "checkpoints/training_loop/../../../../../evil-manifest.json": "'..' in a manifest's key",
}


def test_pull_and_replay_from_a_bucket_with_planted_keys_write_nothing_outside(runner: Runner, moto, bucket) -> None:
    url = f"s3://{bucket}/team"
    script = runner.script()
    rec = runner.run(script, "--flor", "toy", "--epochs", "2", env=_s3_env(runner, moto, url))
    assert "flor: spooled run" in rec.stderr, rec.stderr
    [run] = os.listdir(runner.home / "toy" / "runs")
    client = moto.client()
    for key in PLANTED:
        ATTACKS.append(f"bucket key runs/<run>/{key}")
        client.put_object(Bucket=bucket, Key=f"team/toy/runs/{run}/{key}", Body=b"import os  # evil")
    ATTACKS.append("bucket run folder named '..'")
    client.put_object(Bucket=bucket, Key="team/toy/runs/../run.json", Body=b"{}")
    listed = set(moto.objects(bucket, "team/"))
    assert {f"team/toy/runs/{run}/{k}" for k in PLANTED} <= listed  # the server kept them as planted

    pulled, fresh = runner.cwd / "pulled", runner.cwd / "fresh"
    before = files_outside(runner.cwd, pulled, fresh)
    out = _cli(runner, _s3_env(runner, moto, url, pulled), "pull", "toy")
    assert out.returncode == 0, out.stdout + out.stderr
    assert files_outside(runner.cwd, pulled, fresh) == before
    assert not [p for p in runner.cwd.rglob("*evil*")], list(runner.cwd.rglob("*evil*"))
    assert f"ignored {len(PLANTED)} key(s) of run {run}" in out.stderr, out.stderr
    for key in PLANTED:  # each named, as S3 holds it
        assert key.replace("\\", "\\\\")[-20:] in out.stderr, (key, out.stderr)
    assert "whose names are not run ids: '..'" in out.stderr
    assert (pulled / "toy" / "runs" / run / "run.json").is_file()
    verified = _cli(runner, _s3_env(runner, moto, url, pulled), "verify", "toy")
    assert verified.returncode == 0 and "no problems" in verified.stdout, verified.stdout

    # a colleague replays straight from the bucket with an empty FLOR_HOME
    env = _s3_env(runner, moto, url, fresh)
    replay = runner.run(script, "--flor", "toy", "--epochs", "2", "--replay_flor", env=env, check=False)
    assert replay.returncode == 0, replay.stderr
    assert "replay verified exact" in replay.stderr
    assert files_outside(runner.cwd, pulled, fresh) == before
    assert not [p for p in runner.cwd.rglob("*evil*")]
    assert f"ignored {len(PLANTED)} key(s) of run {run}" in replay.stderr


@pytest.mark.parametrize("planted, why", [
    (b"[1, 2]", "expected a JSON object, found list"),
    (b'{"format": 2, "name": "toy", "run": "r", "status": "finished", "argv": "rm -rf ~"}', "argv is str"),
    (b'{"format": 1, "name": "toy", "run": "r", "status": "finished"}', "older than 0.1.0 (format 1); record again"),
    (b'{"name": "toy", "run', "not valid JSON"),
])
def test_a_pulled_run_json_of_another_type_never_enters_the_store(runner: Runner, moto, bucket,  # noqa: ANN001
                                                                   planted: bytes, why: str) -> None:
    url = f"s3://{bucket}/team"
    script = runner.script()
    runner.run(script, "--flor", "toy", "--epochs", "2", env=_s3_env(runner, moto, url))
    [run] = os.listdir(runner.home / "toy" / "runs")
    moto.client().put_object(Bucket=bucket, Key=f"team/toy/runs/{run}/run.json", Body=planted)
    pulled = runner.cwd / "pulled"
    out = _cli(runner, _s3_env(runner, moto, url, pulled), "pull", "toy")
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and why in lines[0] and f"refusing to pull run {run}" in lines[0], out.stderr
    assert not (pulled / "toy" / "runs" / run / "run.json").exists()


def test_pull_refuses_a_run_of_too_many_files_and_leaves_oversized_ones_in_the_bucket(
        runner: Runner, moto, bucket, monkeypatch) -> None:  # noqa: ANN001
    # the limits (200,000 files a run, 256 MB a metadata file) lowered in this process, so a bucket
    # can go past them in seconds; the server, the keys and the store are real
    from flor.errors import ReplayError
    from flor.store.experiment import ExperimentStore
    from flor.store.sync import pull

    url = f"s3://{bucket}/team"
    runner.run(runner.script(), "--flor", "toy", "--epochs", "2", env=_s3_env(runner, moto, url))
    [run] = os.listdir(runner.home / "toy" / "runs")
    client = moto.client()
    ATTACKS.append("a bucket file over the metadata size limit, and a run of more files than a run has")
    client.put_object(Bucket=bucket, Key=f"team/toy/runs/{run}/logs/huge.jsonl", Body=b'{"x": 1}\n' * 1000)
    for key, value in _s3_env(runner, moto, url).items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    pulled = runner.cwd / "pulled"
    remote = pull.open_spool(url)
    listed = len(moto.objects(bucket, f"team/toy/runs/{run}/"))
    monkeypatch.setattr(pull, "MAX_RUN_KEYS", listed - 1)
    with pytest.raises(ReplayError, match=f"it holds {listed} files, over the {listed - 1} a run of flor has"):
        pull.pull_run(ExperimentStore(pulled, "toy"), remote, run)
    assert not (pulled / "toy").exists()  # refused before anything was written

    monkeypatch.setattr(pull, "MAX_RUN_KEYS", listed)
    monkeypatch.setattr(pull, "MAX_METADATA", 8000)  # the planted log is 9000 bytes; the run's own files fit
    left = r"left 1 file\(s\) of run .*larger than the 7.8 KB .*logs/huge.jsonl' \(8.8 KB\)"
    with pytest.warns(RuntimeWarning, match=left) as caught:
        pull.pull_run(ExperimentStore(pulled, "toy"), remote, run)
    assert len(caught) == 1, [str(w.message) for w in caught]  # (it once said "would lead out of the store")
    runs = pulled / "toy" / "runs" / run
    assert (runs / "run.json").is_file() and (runs / "logs" / "record.jsonl").is_file()
    assert not (runs / "logs" / "huge.jsonl").exists()


# -- secrets ---------------------------------------------------------------------------------------

OPENAI = "sk-proj-" + "Zx9" * 10
GITHUB = "ghp_" + "a1B2c3D4e5" * 4
SECRET_ARGS = {  # value -> how it is given
    "hfsecret_Q1w2E3r4": "--hf_tok {}",
    "pwdsecret_R4t5Y6u7": "--pwd={}",
    "bearersecret_U7i8O9p0": "--bearer {}",
    "ksecret_P0a1S2d3": "-k {}",
    "dbPASSsecret_D3f4G5": "--db postgres://trainer:{}@db.internal:5432/runs",
    OPENAI: "--openai {}",
    GITHUB: "{}",  # a bare positional: found by its shape
}
SECRET_FILES = {  # untracked file -> (its text, the secret in it)
    "secrets.yaml": ("api_token: yamlsecret_G5h6J7k8\n", "yamlsecret_G5h6J7k8"),
    ".env": ("HF_TOKEN=envsecret_J7k8L9z0\n", "envsecret_J7k8L9z0"),
    "config.ini": ("[db]\nuser = trainer\npassword = inisecret_L9z0X1c2\n", "inisecret_L9z0X1c2"),
    "id_rsa": ("-----BEGIN OPENSSH PRIVATE KEY-----\nrsasecret_X1c2V3b4\n-----END OPENSSH PRIVATE KEY-----\n",
               "rsasecret_X1c2V3b4"),
    "settings.yaml": ("lr: 0.1\ndb_password: settingsecret_N5m6Q7w8\n", "settingsecret_N5m6Q7w8"),
    "NOTES.md": (f"push with {GITHUB[:-1]}X\n", GITHUB[:-1] + "X"),
}
ARG_LINES = '''parser.add_argument("--seed", type=int, default=0)
for flag in ("--hf_tok", "--pwd", "--bearer", "-k", "--db", "--openai"):
    parser.add_argument(flag)
parser.add_argument("positional", nargs="?")'''


def _argv() -> list[str]:
    out: list[str] = []
    for value, form in SECRET_ARGS.items():
        out.extend(form.format(value).split())
    return out


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_secrets_in_argv_and_untracked_files_reach_neither_store_nor_bucket(runner: Runner, moto, bucket) -> None:
    url = f"s3://{bucket}/team"
    script = runner.script(edits={'parser.add_argument("--seed", type=int, default=0)': ARG_LINES})
    git_repo(runner.cwd, script)
    for name, (text, _) in SECRET_FILES.items():
        ATTACKS.append(f"untracked secret file {name}")
        (runner.cwd / name).write_text(text)
    (runner.cwd / "helper.py").write_text("WIDTH = 24\n")  # an untracked source file: kept
    ATTACKS.extend(f"argv secret {form.split()[0]}" for form in SECRET_ARGS.values())
    env = _s3_env(runner, moto, url)
    rec = runner.run(script, "--flor", "toy", "--epochs", "2", *_argv(), env=env)
    assert "flor: spooled run" in rec.stderr, rec.stderr
    replay = subprocess.run([sys.executable, "-m", "flor", "replay", "toy", "--workers", "1", "--",
                             sys.executable, script.name, "--epochs", "2", *_argv()],
                            cwd=runner.cwd, env=env, capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    spool = _cli(runner, env, "spool", "toy")  # the launch record and replay logs go up too
    assert spool.returncode == 0, spool.stdout + spool.stderr

    [run] = os.listdir(runner.home / "toy" / "runs")
    run_dir = runner.home / "toy" / "runs" / run
    assert list((run_dir / "logs").glob("launch-*.json")), "the replay wrote no launch record"
    meta = json.loads((run_dir / "run.json").read_text())
    assert "***" in meta["argv"] and "postgres://trainer:***@db.internal:5432/runs" in meta["argv"]
    assert meta["hyperparameters"]["hf_tok"] == "***" and meta["hyperparameters"]["epochs"] == 2
    diff = (run_dir / "source" / "diff.patch").read_text()
    assert "+++ b/helper.py" in diff and "+WIDTH = 24" in diff  # source still travels with the run
    assert {"secrets.yaml", "settings.yaml", "NOTES.md"} <= set(meta["git"]["untracked_skipped"])

    secrets = [*SECRET_ARGS, *(s for _, s in SECRET_FILES.values())]
    stored = {p.relative_to(runner.home).as_posix(): p.read_bytes() for p in runner.home.rglob("*") if p.is_file()}
    in_bucket = moto.objects(bucket, "team/")
    assert any("launch-" in k for k in in_bucket) and any(k.endswith("diff.patch") for k in in_bucket)
    for secret in secrets:
        assert not [k for k, v in stored.items() if secret.encode() in v], secret
        assert not [k for k, v in in_bucket.items() if secret.encode() in v], secret
        assert secret not in replay.stdout + replay.stderr + spool.stdout + spool.stderr, secret
