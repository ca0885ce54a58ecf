"""Files of a shared store that are not what their names say (DESIGN.md §3: everything read from
a store is untrusted input; sharing.md's threat model).

Someone with write access to a store puts a FIFO, a device, a huge sparse file or a symbolic
link where flor expects run.json, a manifest, a blob, a log, a summary or a launch record, or
links a run's folder out of the store. Each test attacks a copy of a real recording of toy.py
through the real ``flor`` command or a real replay in a subprocess, and checks that the bad
file costs only itself: no hang (every subprocess has a timeout), one line naming the file and
the problem, no traceback, and nothing read from or written to a file outside the store.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import Runner

TIMEOUT = 120  # a FIFO that is opened for reading blocks forever: a hang fails the test here


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("hostile"))
    script = r.script()
    for lr in ("0.01", "0.02"):
        r.run(script, "--epochs", "3", "--lr", lr, "--flor", "toy")
    return r


@pytest.fixture
def store(recorded: Runner, tmp_path: Path) -> Runner:
    """A copy of the recorded store and script, to attack."""
    r = Runner(tmp_path)
    shutil.copytree(recorded.home, r.home, symlinks=True)
    shutil.copy(recorded.cwd / "toy.py", r.cwd / "toy.py")
    return r


def runs(r: Runner) -> list[str]:
    return sorted(p.name for p in (r.home / "toy" / "runs").iterdir())


def flor(r: Runner, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flor", *args], cwd=r.cwd, env=r.env(), capture_output=True,
                          text=True, timeout=TIMEOUT)


def replay(r: Runner, *args: str, **env: str) -> subprocess.CompletedProcess:
    return r.run(r.cwd / "toy.py", "--epochs", "3", "--lr", "0.02", "--flor", "toy", *args, "--replay_flor",
                 env=r.env(**env), check=False, timeout=300)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr


def lines_naming(proc: subprocess.CompletedProcess, fragment: str) -> list[str]:
    return [line for line in proc.stderr.splitlines() if fragment in line]


# -- reads: a FIFO, a device, a huge file, a link in place of a store file ----------------------

def _manifest(r: Runner, run: str, epoch: int = 1) -> Path:
    return r.home / "toy" / "runs" / run / "checkpoints" / "training_loop" / f"{epoch}.json"


def _a_blob_of(r: Runner, run: str, epoch: int = 1) -> Path:
    from flor.store.experiment import blob_hashes

    digest = sorted(blob_hashes(json.loads(_manifest(r, run, epoch).read_bytes())))[0]
    return r.home / "toy" / "objects" / digest[:2] / digest[2:]


def _fifo(path: Path) -> str:
    path.unlink()
    os.mkfifo(path)  # opening it for reading waits for a writer forever
    return "a FIFO, not a regular file"


def _huge(path: Path) -> str:
    with open(path, "r+b") as fh:  # sparse: 300 MB that take no disk, read whole before the fix
        fh.truncate(300 * 1024 * 1024)
    return "over the 256.0 MB flor reads of such a file"


def _link_inside(path: Path) -> str:
    other = path.with_name("elsewhere.bin")
    path.rename(other)
    path.symlink_to(other.name)  # a link to a file inside the store: a store written by flor holds none
    return "a symbolic link"


@pytest.mark.parametrize("attack", [_fifo, _huge, _link_inside], ids=lambda f: f.__name__.strip("_"))
def test_a_bad_manifest_costs_only_its_checkpoint(store: Runner, attack) -> None:  # noqa: ANN001
    _, last = runs(store)
    manifest = _manifest(store, last)
    why = attack(manifest)
    proc = replay(store)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    named = lines_naming(proc, str(manifest))
    assert named and all(why in line for line in named), proc.stderr
    assert "replay verified exact" in proc.stderr, proc.stderr  # epoch 1 re-executed from epoch 0

    verify = flor(store, "verify", "toy")
    no_traceback(verify)
    assert verify.returncode == 1 and why in verify.stdout and str(manifest) in verify.stdout, verify.stdout


@pytest.mark.parametrize("attack", [_fifo, _link_inside], ids=lambda f: f.__name__.strip("_"))
def test_a_bad_blob_costs_only_its_checkpoint(store: Runner, attack) -> None:  # noqa: ANN001
    _, last = runs(store)
    blob = _a_blob_of(store, last, 2)
    why = attack(blob)
    proc = replay(store)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert any(why in line for line in lines_naming(proc, blob.name)), proc.stderr
    assert "replay verified exact" in proc.stderr, proc.stderr


@pytest.mark.parametrize("attack", [_fifo, _huge, _link_inside], ids=lambda f: f.__name__.strip("_"))
def test_a_bad_run_json_is_skipped_with_one_line(store: Runner, attack) -> None:  # noqa: ANN001
    first, last = runs(store)
    run_json = store.home / "toy" / "runs" / last / "run.json"
    why = attack(run_json)
    proc = flor(store, "ls", "toy")
    no_traceback(proc)
    assert proc.returncode == 0 and first in proc.stdout, (proc.stdout, proc.stderr)
    assert [line for line in proc.stderr.splitlines() if line] == lines_naming(proc, str(run_json)), proc.stderr
    assert len(lines_naming(proc, why)) == 1, proc.stderr
    shown = flor(store, "show", "toy", last)
    no_traceback(shown)
    assert shown.returncode == 2 and why in shown.stderr and len(shown.stderr.splitlines()) == 1, shown.stderr


def test_a_log_without_newlines_is_not_read_into_memory(store: Runner) -> None:
    """A 1 GB log of zeros (sparse: no disk) has one 'line': read whole, it took over 1 GB of memory."""
    _, last = runs(store)
    log = store.home / "toy" / "runs" / last / "logs" / "replay-x-0.jsonl"
    with open(log, "wb") as fh:
        fh.truncate(1 << 30)
    code = ("import resource, subprocess, sys\n"
            "p = subprocess.run([sys.executable, '-m', 'flor', 'logs', 'toy', '--run', 'all'], capture_output=True, "
            "text=True)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, p.returncode)\n"
            "sys.stderr.write(p.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=store.cwd, env=store.env(), capture_output=True,
                          text=True, timeout=TIMEOUT)
    no_traceback(proc)
    peak_kb, rc = map(int, proc.stdout.split())
    assert rc == 0, proc.stderr
    assert peak_kb < 600 * 1024, f"flor logs peaked at {peak_kb // 1024} MB reading a log without newlines"
    assert "skipped 1 damaged line(s) of" in proc.stderr and log.name in proc.stderr, proc.stderr


def test_a_link_to_a_file_outside_is_never_read(store: Runner, tmp_path: Path) -> None:
    """A replay summary linked to a file outside the store (a private file of the reader's) is
    refused: its content never reaches flor's output."""
    _, last = runs(store)
    secret = tmp_path / "private.json"
    secret.write_text(json.dumps({"verdict": "SECRET-VERDICT", "hindsight": ["SECRET-NAME"]}))
    logs = store.home / "toy" / "runs" / last / "logs"
    (logs / "replay-x-0.summary.json").symlink_to(secret)
    (logs / "replay-x-0.jsonl").write_text('{"name": "acc", "value": 1.5, "epoch": 0}\n')
    proc = flor(store, "show", "toy", last)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert "SECRET" not in proc.stdout + proc.stderr, proc.stdout


# -- writes: a link planted where a replay writes ----------------------------------------------

def test_a_replay_never_writes_through_a_link_planted_at_its_files(store: Runner, tmp_path: Path) -> None:
    """Dangling links at the files a replay with a known id will write (its log, output, marks):
    before, the replay created the link targets outside the store with its own content."""
    _, last = runs(store)
    outside = tmp_path / "outside"
    outside.mkdir()
    run_dir = store.home / "toy" / "runs" / last
    planted = {run_dir / "logs" / "replay-known-0.jsonl": outside / "evil.pth",
               run_dir / "replay-known-0.log": outside / "evil.sh",
               run_dir / "replay-known-0.marks.jsonl": outside / "evil.marks"}
    for link, target in planted.items():
        link.symlink_to(target)
    proc = replay(store, FLOR_REPLAY_ID="known")
    no_traceback(proc)
    assert proc.returncode == 0 and "replay verified exact" in proc.stderr, proc.stderr
    assert list(outside.iterdir()) == []
    assert (run_dir / "logs" / "replay-known-0.jsonl").is_file()  # the replay's own, fresh


@pytest.mark.parametrize("folder", ["logs", "tb"])
def test_a_run_folder_linked_out_of_the_store_is_refused(store: Runner, tmp_path: Path, folder: str) -> None:
    _, last = runs(store)
    outside = tmp_path / "outside"
    run_dir = store.home / "toy" / "runs" / last
    if (run_dir / folder).exists():
        shutil.move(run_dir / folder, outside)
    else:
        outside.mkdir()
    (run_dir / folder).symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.rglob("*"))
    proc = replay(store)
    no_traceback(proc)
    assert proc.returncode == 2, proc.stderr
    assert "leads out of the store" in proc.stderr and str(run_dir / folder) in proc.stderr, proc.stderr
    assert sorted(p.name for p in outside.rglob("*")) == before


# -- listing: a run folder that is a link out of the store -------------------------------------

def test_a_run_folder_linked_out_of_the_store_is_skipped_with_one_line(store: Runner, tmp_path: Path) -> None:
    first, last = runs(store)
    outside = tmp_path / "elsewhere"
    shutil.copytree(store.home / "toy" / "runs" / last, outside)
    planted = store.home / "toy" / "runs" / "20990101T000000.000000-evil"
    planted.symlink_to(outside, target_is_directory=True)
    proc = flor(store, "ls", "toy")
    no_traceback(proc)
    assert proc.returncode == 0 and "evil" not in proc.stdout and first in proc.stdout, proc.stdout
    named = lines_naming(proc, planted.name)
    assert len(named) == 1 and "leads out of the store" in named[0], proc.stderr


# -- summaries and launch records of other shapes ------------------------------------------------

BAD_SUMMARIES = {  # file content -> what the note says
    '{"replay": "x", "ngpus": "two"}': "ngpus is str 'two', expected int",
    '{"segment": "ab", "verdict": "exact"}': "segment is 'ab', expected [start, stop]",
    '{"blocks": [{"bogus": 1}]}': "blocks holds {'bogus': 1}, not a block event",
    '[1, 2]': "it is a JSON list, expected an object",
}
BAD_LAUNCHES = {
    '{"replay": "y", "started": [1], "status": "running", "pid": "abc"}': "started is list [1], expected int or float",
    '{"replay": "z", "segments": [5]}': "segments holds 5, not a worker's segment",
    '"a string"': "it is a JSON str, expected an object",
}


@pytest.mark.parametrize("content", list(BAD_SUMMARIES))
def test_a_replay_summary_of_another_shape_is_skipped_with_one_line(store: Runner, content: str) -> None:
    _, last = runs(store)
    path = store.home / "toy" / "runs" / last / "logs" / "replay-x-0.summary.json"
    path.write_text(content)
    proc = flor(store, "replay", "toy", "--report", "x")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    named = lines_naming(proc, str(path))
    assert len(named) == 1 and BAD_SUMMARIES[content] in named[0] and "move it out" in named[0], proc.stderr


def test_launch_records_of_another_shape_are_skipped_with_one_line(store: Runner) -> None:
    _, last = runs(store)
    logs = store.home / "toy" / "runs" / last / "logs"
    for i, content in enumerate(BAD_LAUNCHES):
        (logs / f"launch-bad{i}.json").write_text(content)
    for args in (["--plan"], []):  # the estimate reads the records, and so does a launch (to resume)
        proc = flor(store, "replay", "toy", *args, "--", sys.executable, "toy.py", "--epochs", "3", "--lr", "0.02")
        no_traceback(proc)
        assert proc.returncode == 0, (args, proc.stderr)
        for i, content in enumerate(BAD_LAUNCHES):
            named = lines_naming(proc, str(logs / f"launch-bad{i}.json"))
            assert len(named) == 1 and BAD_LAUNCHES[content] in named[0], (args, proc.stderr)
