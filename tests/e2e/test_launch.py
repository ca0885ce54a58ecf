"""``flor replay``: the launcher on CPU, resuming after a killed worker, epoch selection,
Slurm placement by hand, ``--plan``, and the merged views.

Every replayed value is compared with a full re-execution of the edited script, bit for bit.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import Runner, values
from flor.errors import ConfigError, FlorError
from flor.launch.executor import Executor
from flor.launch.local import LocalExecutor
from flor.launch.launcher import Launch, stop_workers
from flor.logs import merge_newest
from flor.store.runlogs import read_run_logs
from flor.plan import make_plan
from flor.store import ExperimentStore
from flor.launch.workers import WorkerState

EPOCHS = 6
# a hindsight log in the outer loop; KILL_AT=E makes the worker SIGKILL itself at epoch E (the
# kill sits inside the flor.log call, so the edit still counts as logging only)
OUTER = {"    # OUTER": '    flor.log("wnorm", float(sum(p.detach().double().norm() for p in net.parameters())) '
                       'if __import__("os").environ.get("KILL_AT") != str(epoch) else '
                       '__import__("os").kill(__import__("os").getpid(), 9))'}
PROBED = {'step_into("training_loop")': 'step_into("training_loop", probed=True)'}


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> Runner:
    """toy.py recorded once, and the edited script run in full (the values replay must give)."""
    r = Runner(tmp_path_factory.mktemp("launch"))
    r.run(r.script(), "--epochs", str(EPOCHS), "--flor", "toy")
    r.run(r.script(edits=OUTER, dest="outer.py"), "--epochs", str(EPOCHS), "--flor", "full")
    r.script(edits=PROBED, dest="probed.py")
    return r


def flor_replay(r: Runner, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flor", "replay", "toy", *args], cwd=r.cwd, env=env or r.env(),
                          capture_output=True, text=True, timeout=300)


def replay_logs(r: Runner, replay: str, name: str = "toy") -> list[dict]:
    run_dir = next((r.home / name / "runs").iterdir())
    return [x for x in read_run_logs(run_dir, run_dir.name) if x["replay"] == replay]


def replay_id(proc: subprocess.CompletedProcess) -> str:
    line = next(x for x in proc.stderr.splitlines() if x.startswith("flor: replay "))
    return line.split()[2]


def test_two_workers_killed_midway_then_resumed(rec):
    """Worker 1 dies at epoch 4; worker 0 finishes; rerunning replays only segment 1; every
    epoch is replayed exactly once, with the values of a full re-execution."""
    cmd = ["--workers", "2", "--", sys.executable, "outer.py", "--epochs", str(EPOCHS)]
    first = flor_replay(rec, *cmd, env=rec.env(KILL_AT="4"))
    assert first.returncode == 1, first.stderr
    assert "worker 1 (epochs 3-5) failed: killed by SIGKILL; its last lines:" in first.stderr
    assert "epoch 3 acc" in first.stderr.split("killed by SIGKILL")[1]  # the worker's output tail
    assert "[w0] epoch 2 acc" in first.stdout and "[w1] epoch 3 acc" in first.stdout  # streamed, prefixed
    assert "run the same `flor replay` command again" in first.stderr
    rid = replay_id(first)

    second = flor_replay(rec, *cmd)
    assert second.returncode == 0, second.stderr
    assert f"flor: replay {rid} " in second.stderr and "resuming: 1 of 2 segments left" in second.stderr
    assert "[w0]" not in second.stdout and "[w1] epoch 5 acc" in second.stdout
    assert "flor: replay verified exact: 6 blocks restored" in second.stderr
    assert "worker 0: epochs 0-2 (initialization none): verified exact" in second.stderr

    logs = replay_logs(rec, rid)
    wnorm = sorted((x["epoch"], x["worker"]) for x in logs if x["name"] == "wnorm")
    assert wnorm == [(e, 0 if e < 3 else 1) for e in range(EPOCHS)]  # each epoch exactly once
    assert values(logs) == values(rec.logs("full"), "record")
    run_dir = next((rec.home / "toy" / "runs").iterdir())
    killed = run_dir / "attempts" / f"{rid}-1-0"
    assert (killed / f"replay-{rid}-1.log").is_file()  # the killed attempt is kept, out of the readers' way
    record = json.loads((run_dir / "logs" / f"launch-{rid}.json").read_text())
    assert record["status"] == "finished" and [w["skipped"] for w in record["segments"]] == [True, False]
    # the worker's start-up and wind-down, measured for the next --plan
    assert 0 < record["segments"][1]["startup_s"] < record["segments"][1]["seconds"]


def test_one_worker_gives_the_same_values(rec):
    proc = flor_replay(rec, "--workers", "1", "--fresh", "--", sys.executable, "outer.py", "--epochs", str(EPOCHS))
    assert proc.returncode == 0, proc.stderr
    assert "worker 0: epochs 0-5 (initialization none): verified exact" in proc.stderr
    assert values(replay_logs(rec, replay_id(proc))) == values(rec.logs("full"), "record")


def test_epoch_selection_replays_only_those_epochs(rec):
    proc = flor_replay(rec, "--workers", "2", "--epochs", "2:5", "--", sys.executable, "outer.py",
                       "--epochs", str(EPOCHS))
    assert proc.returncode == 0, proc.stderr
    assert "epochs 2-4, 2 workers" in proc.stderr
    assert "worker 1: epochs 3-4 (initialization 2)" in proc.stderr
    logs = replay_logs(rec, replay_id(proc))
    assert sorted(x["epoch"] for x in logs if x["name"] == "wnorm") == [2, 3, 4]
    full = values(rec.logs("full"), "record")
    assert values(logs) == {k: v for k, v in full.items() if k[1] in (2, 3, 4)}


def test_slurm_array_by_hand_and_the_merged_report(rec):
    """Two array tasks placed only by Slurm's variables share a replay id; --report merges them;
    the newest replay wins per epoch in the merged view."""
    def task(t: int) -> subprocess.CompletedProcess:  # both tasks run at once, as an array's do
        return rec.run(rec.cwd / "outer.py", "--epochs", str(EPOCHS), "--flor", "toy", "--replay_flor", check=False,
                       env=rec.env(SLURM_ARRAY_JOB_ID="4242", SLURM_ARRAY_TASK_ID=str(t), SLURM_ARRAY_TASK_COUNT="2",
                                   SLURM_ARRAY_TASK_MIN="0"))

    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(task, range(2)))
    assert all(p.returncode == 0 for p in procs), [(p.stdout, p.stderr) for p in procs]
    assert "worker 1/2: epochs 3-5" in procs[1].stderr
    report = flor_replay(rec, "--report", "slurm4242")
    assert report.returncode == 0, report.stderr
    assert "worker 0: epochs 0-2" in report.stdout and "worker 1: epochs 3-5" in report.stdout
    assert report.stdout.strip().splitlines()[-1].startswith("flor: replay verified exact: 6 blocks restored")
    logs = replay_logs(rec, "slurm4242")
    assert values(logs) == values(rec.logs("full"), "record")
    run_dir = next((rec.home / "toy" / "runs").iterdir())
    merged = [x for x in merge_newest(read_run_logs(run_dir, run_dir.name)) if x["name"] == "wnorm"]
    assert sorted(x["epoch"] for x in merged) == list(range(EPOCHS))  # one value per epoch, many replays
    assert (run_dir / "tb" / "replay-slurm4242").is_dir()  # TensorBoard: one folder a replay, a file a worker
    assert len(list((run_dir / "tb" / "replay-slurm4242").iterdir())) == 2


def test_plan_prints_segments_and_estimates_without_running(rec):
    before = rec.tree()
    proc = flor_replay(rec, "--plan", "--workers", "2", "--json", "--", sys.executable, "probed.py")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["segments"] == [[0, 3], [3, 6]] and plan["init"] == [[0, 0], [2, 3]]
    assert plan["probed"] == ["training_loop"] and plan["workers"] == 2
    assert max(plan["seconds"]) > plan["startup_s"] > 0 and plan["launcher_s"] > 0  # the plan's own process so far
    assert abs(plan["estimate_s"] - (max(plan["seconds"]) + plan["launcher_s"])) < 0.002  # each rounded to ms
    assert 1 <= plan["fastest"][0] <= 2 and set(plan["by_count"]) >= {"1"}
    text = flor_replay(rec, "--plan", "--workers", "2", "--", sys.executable, "probed.py").stdout
    assert "worker 1: epochs 3-5" in text and "initialization epochs 2 " in text and "fastest:" in text
    assert rec.tree() == before  # --plan runs nothing and writes nothing


@pytest.mark.parametrize("args, message", [
    (["--workers", "2", "--", sys.executable, "outer.py", "--replay_flor"], "leave --replay_flor out of the command"),
    (["--workers", "2", "--", sys.executable, "outer.py", "--flor", "other"], "names --flor other"),
    (["--epochs", "9:12", "--", sys.executable, "outer.py"], "selects no epoch"),
    (["--epochs", "5:2", "--", sys.executable, "outer.py"], "B must be greater than A"),
    (["--workers", "2"], "give the training command after --"),
])
def test_bad_requests_fail_with_one_line(rec, args, message):
    proc = flor_replay(rec, *args)
    assert proc.returncode == 2 and message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_worker_environment_places_gpus_threads_and_segments(rec):
    store = ExperimentStore(rec.home, "toy")
    run = store.resolve_run(None)
    launch = Launch(store, run, [sys.executable, "outer.py"], workers=3, gpus=["0", "1"], epoch_range=(1, 5),
                    strong=True, threads=None, fresh=True, out=io.StringIO(), err=io.StringIO())
    envs = [launch.env(w) for w in range(3)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "0"]  # one GPU each, round-robin
    assert [e["FLOR_REPLAY"] for e in envs] == ["0/3", "1/3", "2/3"]
    assert {e["FLOR_REPLAY_ID"] for e in envs} == {launch.replay_id}
    assert (envs[0]["FLOR_RUN"], envs[0]["FLOR_EPOCHS"], envs[0]["FLOR_STRONG"]) == (run, "1:5", "1")
    assert envs[0]["OMP_NUM_THREADS"] == "1" and "FLOR_THREADS" not in envs[0]  # the recorded count
    assert "RANK" not in envs[0]  # not a DDP recording: no world of one to set up
    assert [list(p.segment) for p in launch.estimate.plans] == [[1], [2], [3, 4]]
    assert all(len(p.init) == p.segment.start for p in launch.estimate.plans)  # --strong: from epoch 0


def test_workers_that_exceed_the_cores_wait_passively_unless_the_user_chose(rec, monkeypatch):
    """OpenMP threads spin while they wait: workers whose teams together exceed the cores spun on the
    cores the others needed (2 probed workers of 2 threads on 2 cores took up to 3.1x one worker)."""
    import flor.launch.estimate as estimate

    monkeypatch.setattr(estimate, "cores", lambda: 2)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    store = ExperimentStore(rec.home, "toy")
    run = store.resolve_run(None)

    def launch(workers: int, gpus: list[str]) -> Launch:
        return Launch(store, run, [sys.executable, "outer.py"], workers=workers, gpus=gpus, epoch_range=None,
                      strong=False, threads=None, fresh=True, out=io.StringIO(), err=io.StringIO())

    three = launch(3, [])  # 3 workers x the recorded 1 thread on 2 cores
    assert {three.env(w).get("OMP_WAIT_POLICY") for w in range(3)} == {"PASSIVE"}
    assert "OpenMP threads wait passively" in " ".join(three._placement_notes())
    assert "OMP_WAIT_POLICY" not in launch(2, []).env(0)  # 2 x 1 fits: OpenMP's own policy
    assert "OMP_WAIT_POLICY" not in launch(3, ["0", "1"]).env(0)  # on GPUs
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice is kept (estimated as spinning: doctest)
    assert launch(3, []).env(0)["OMP_WAIT_POLICY"] == "ACTIVE"


class ScriptedWorker:
    """A worker that prints its lines and exits with ``rc`` without replaying anything."""

    def __init__(self, lines: list[str], rc: int) -> None:
        self._lines, self._rc, self._ended = lines, rc, False

    def lines(self):
        yield from self._lines
        self._ended = True

    def poll(self):
        return self._rc if self._ended else None

    def stop(self) -> None:
        pass

    def wait(self) -> int:
        return self._rc


class ScriptedExecutor:
    def __init__(self) -> None:
        self.opened, self.started = False, []

    def open(self) -> None:
        self.opened = True

    def start(self, index, command, env, *, threads):
        self.started.append((index, env["FLOR_REPLAY"], threads))
        return ScriptedWorker([f"hello from {index}\n", "no newline"], rc=index)


def test_any_executor_runs_through_the_one_loop(rec):
    """The launch knows no executor: a scripted one gets each worker's environment, its lines are
    printed with their prefix, and workers that wrote no summary are reported as failed."""
    store = ExperimentStore(rec.home, "toy")
    out, err = io.StringIO(), io.StringIO()
    launch = Launch(store, store.resolve_run(None), [sys.executable, "outer.py"], workers=2, gpus=[],
                    epoch_range=None, strong=False, threads=None, fresh=True, out=out, err=err)
    executor = ScriptedExecutor()
    assert isinstance(executor, Executor) and launch.execute(executor) == 1
    assert executor.opened and executor.started == [(0, "0/2", 1), (1, "1/2", 1)]
    assert "[w0] hello from 0\n" in out.getvalue() and "[w1] no newline\n" in out.getvalue()
    assert "worker 0 (epochs 0-2) failed: no summary was written" in err.getvalue()
    assert "worker 1 (epochs 3-5) failed: exit code 1; its last lines:\n      hello from 1\n      no newline" \
        in err.getvalue()
    record = json.loads((launch.run_dir / "logs" / f"launch-{launch.replay_id}.json").read_text())
    assert record["status"] == "failed" and [w["rc"] for w in record["segments"]] == [0, 1]


class VanishingCommandExecutor(LocalExecutor):
    """Real worker processes; before worker 1 starts, the command's executable is removed (it
    passed the launcher's check), so its spawn fails with the real FileNotFoundError."""

    def start(self, index, command, env, *, threads):
        if index == 1:
            Path(command[0]).unlink()
        return super().start(index, command, env, threads=threads)


def _python_at(path: Path) -> None:
    """An executable at ``path`` that runs this interpreter (a link to it would not: outside its
    folder, a virtual environment's interpreter no longer finds the environment)."""
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    path.chmod(0o755)


def test_a_worker_that_cannot_start_ends_the_launch_as_failed(rec, tmp_path, monkeypatch):
    """A worker whose start fails after the check (here its executable vanished) stops the workers
    already started, leaves the launch record 'failed' with the reason, and is one FlorError line;
    the same command then resumes the launch."""
    monkeypatch.chdir(rec.cwd)  # where the command's script is, as for the CLI below
    for key, value in rec.env().items():  # the workers' store and config are the test's, never the user's
        monkeypatch.setenv(key, value)
    python = tmp_path / "python"
    _python_at(python)
    store = ExperimentStore(rec.home, "toy")
    run = store.resolve_run(None)
    command = [str(python), "outer.py", "--epochs", str(EPOCHS)]
    err = io.StringIO()
    launch = Launch(store, run, command, workers=2, gpus=[], epoch_range=None, strong=False, threads=None,
                    fresh=True, out=io.StringIO(), err=err)
    with pytest.raises(FlorError) as caught:
        launch.execute(VanishingCommandExecutor())
    message = str(caught.value)
    assert "\n" not in message and message.startswith("worker 1 (epochs 3-5) could not start: command not found: ")
    assert f"1 started worker(s) stopped, launch {launch.replay_id} recorded as failed" in message
    record = json.loads((launch.run_dir / "logs" / f"launch-{launch.replay_id}.json").read_text())
    assert record["status"] == "failed" and record["error"].startswith("worker 1 (epochs 3-5) could not start")
    assert record["ended"] is not None and record["segments"][0]["rc"] is not None  # worker 0 was stopped and awaited
    _python_at(python)
    again = flor_replay(rec, "--workers", "2", "--", *command)
    assert again.returncode == 0 and "resuming: 2 of 2 segments left" in again.stderr, again.stderr


def test_two_launches_that_resume_one_replay_at_once_run_it_once(rec, monkeypatch):
    """Two `flor replay` commands started together after a failed launch both find it unfinished.
    The first claims it as it starts; the second then says it is running (the CLI's exit 2),
    instead of running the same segments beside it (every value logged twice in one file)."""
    monkeypatch.chdir(rec.cwd)
    store = ExperimentStore(rec.home, "toy")
    run = store.resolve_run(None)
    command = [sys.executable, "outer.py", "--epochs", str(EPOCHS), "--claimed"]  # this test's launches only
    kw = dict(workers=2, gpus=[], epoch_range=None, strong=False, threads=None, out=io.StringIO(), err=io.StringIO())
    failed = Launch(store, run, command, fresh=True, **kw)
    failed.write_record("failed")
    first = Launch(store, run, command, fresh=False, **kw)  # its workers not started yet
    assert first.resumed and first.replay_id == failed.replay_id
    with pytest.raises(ConfigError, match=f"replay {failed.replay_id} of this run is still running"):
        Launch(store, run, command, fresh=False, **kw)
    first.write_record("finished")


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie: ended
    except OSError:
        return True


SLEEPY = ["--workers", "2", "--", sys.executable, "sleepy.py", "--epochs", str(EPOCHS)]


def _launch_until_both_run(rec: Runner) -> tuple[subprocess.Popen, list[int], list[str]]:
    """``flor replay`` of a slowed-down outer.py, two workers; returns once both are in their loops."""
    rec.script(edits={"    # OUTER": "    __import__('time').sleep(0.3)",  # quiet after epoch 0: a closed pipe never ends it
                      '    print(f"epoch {epoch}': '    if epoch == 0: print(f"epoch {epoch}',
                      'step {step}")': 'step {step}", flush=True)'}, dest="sleepy.py")
    proc = subprocess.Popen([sys.executable, "-m", "flor", "replay", "toy", "--fresh", *SLEEPY], cwd=rec.cwd,
                            env=rec.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)])
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # both in their epoch loops: worker 1's first note is printed there
        seen.append(line)
        if any(x.startswith("[w0] epoch 0 ") for x in seen) and \
                any(x.startswith("[w1] flor: FL320 outer-loop variables restored") for x in seen):
            break
    workers = _children(proc.pid)
    assert len(workers) == 2, "".join(seen)
    return proc, workers, seen


def _ended(proc: subprocess.Popen, workers: list[int], seen: list[str]) -> str:
    """The launcher's remaining output once it ended (a hang bound, not a timing)."""
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        for pid in (*workers, proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the launcher still waits on its workers:\n" + "".join(seen))
    return out


def test_ctrl_c_ends_a_launch_whose_worker_is_stopped(rec):
    """A worker stopped by SIGSTOP (a busy node, a Ctrl-Z) does not act on SIGTERM until it is
    continued: the launcher's Ctrl-C waited on it for ever. Now it is continued with its SIGTERM,
    the launch ends as failed (exit 1) and the same command resumes it."""
    proc, workers, seen = _launch_until_both_run(rec)
    os.kill(workers[0], signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    out = _ended(proc, workers, seen)
    assert proc.returncode == 1, out
    assert "flor: interrupted; run the same command again" in out
    assert all(_gone(pid) for pid in workers)
    again = flor_replay(rec, *SLEEPY)
    assert again.returncode == 0 and "resuming:" in again.stderr, again.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_launcher_takes_its_workers_along_and_resumes(rec, sig):
    """SIGTERM (``kill``, a scheduler) ended the launcher alone, like SIGKILL: its workers replayed
    on, unwatched, beside the resumed launch's workers, whose files they shared. Now SIGTERM stops
    them as Ctrl-C does (exit 1, launch recorded failed), and after a SIGKILL they end with it;
    the same command then replays every epoch once."""
    proc, workers, seen = _launch_until_both_run(rec)
    proc.send_signal(sig)
    out = _ended(proc, workers, seen)
    if sig == signal.SIGTERM:
        assert proc.returncode == 1 and "flor: interrupted; run the same command again" in out, out
    for _ in range(600):  # after a SIGKILL the workers end by themselves: bounded, not timed
        if all(_gone(pid) for pid in workers):
            break
        time.sleep(0.1)
    assert all(_gone(pid) for pid in workers), "a worker outlived its launcher"
    again = flor_replay(rec, *SLEEPY)
    assert again.returncode == 0 and "resuming: 2 of 2 segments left" in again.stderr, again.stderr
    run_dir = next((rec.home / "toy" / "runs").iterdir())
    for w in range(2):  # each killed worker was stopped, not left to finish (or to die of the closed pipe)
        summary = run_dir / "attempts" / f"{replay_id(again)}-{w}-0" / f"replay-{replay_id(again)}-{w}.summary.json"
        if summary.exists():  # one stopped in its first epochs may have had none to write
            assert json.loads(summary.read_text())["exit"] == "terminated"
    epochs = sorted(x["epoch"] for x in replay_logs(rec, replay_id(again)) if x["name"] == "acc")
    assert epochs == list(range(EPOCHS))


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace():
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    state = WorkerState(0, make_plan(4, 0, 1, range(4)))
    state.handle = LocalExecutor().start(0, [sys.executable, "-c", code], dict(os.environ), threads=1)
    assert next(iter(state.handle.lines())) == "ready\n"
    stop_workers([state], grace_s=0.5)
    assert state.rc == -signal.SIGKILL


def test_more_workers_than_epochs_replay_with_one_worker_an_epoch(rec):
    """--workers 8 for 2 epochs planned 6 workers with nothing to replay: never started, they were
    listed as missing and the last line said 'replay FAILED (6 of 8 workers did not finish)' under
    exit status 0. Now the launch has one worker an epoch, says so, and verifies."""
    proc = flor_replay(rec, "--workers", "8", "--epochs", "4:6", "--", sys.executable, "outer.py", "--epochs", str(EPOCHS))
    assert proc.returncode == 0, proc.stderr
    assert "flor: FL503 --workers 8: 2 epoch(s) to replay, so 2 worker(s)" in proc.stderr
    assert "missing" not in proc.stderr and proc.stderr.splitlines()[-1].startswith("flor: replay verified exact")
    full = values(rec.logs("full"), "record")
    assert values(replay_logs(rec, replay_id(proc))) == {k: v for k, v in full.items() if k[1] in (4, 5)}


def test_a_launch_of_a_live_recording_replays_the_epochs_it_planned(tmp_path, monkeypatch):
    """The launcher planned the epochs a live recording had finished; each worker read the run
    again as it started, by then further along (here finished), and replayed its share of other
    segments: every worker 'failed' (exit 1). The workers now replay the epochs planned."""
    r = Runner(tmp_path)
    gate = tmp_path / "gate"
    script = r.script(edits={"    # OUTER": "    while epoch == 2 and not __import__('os').path.exists("
                                          f"{str(gate)!r}): __import__('time').sleep(0.05)"})
    recording = subprocess.Popen([sys.executable, str(script), "--epochs", str(EPOCHS), "--flor", "live"],
                                 cwd=r.cwd, env=r.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run_json = None
        for _ in range(1200):  # until 2 epochs are done: the third waits for the gate
            found = list((r.home / "live" / "runs").glob("*/run.json"))
            if found and json.loads(found[0].read_text()).get("epochs_done") == 2:
                run_json = found[0]
                break
            time.sleep(0.1)
        assert run_json is not None, "the recording never finished 2 epochs"
        monkeypatch.chdir(r.cwd)
        for key, value in r.env().items():
            monkeypatch.setenv(key, value)
        store = ExperimentStore(r.home, "live")
        err = io.StringIO()
        launch = Launch(store, run_json.parent.name, [sys.executable, script.name, "--epochs", str(EPOCHS)], workers=2,
                        gpus=[], epoch_range=None, strong=False, threads=None, fresh=True, out=io.StringIO(), err=err)
        gate.touch()
        assert recording.wait(timeout=120) == 0  # the recording finished all its epochs before the workers start
    finally:
        recording.kill()
        recording.wait()
    assert launch.execute(LocalExecutor()) == 0, err.getvalue()
    assert "flor: replay verified exact: 2 blocks restored" in err.getvalue()
    assert sorted(x["epoch"] for x in replay_logs(r, launch.replay_id, "live") if x["name"] == "acc") == [0, 1]


def test_a_resumed_launch_keeps_the_divergence_of_a_segment_done_before(rec):
    """Worker 0 diverged (exit 3) while worker 1 was killed; the same command resumed only worker
    1, which verified, and exited 0 under a merged summary ending 'replay DIVERGED ... exit
    status 3'. The exit status now counts the segments done before the resume too."""
    rec.script(edits={**PROBED, **OUTER, "xb = xb + 0.01 * torch": "xb = xb + (0.02 if epoch < 3 else 0.01) * torch"},
               dest="diverge.py")
    cmd = ["--workers", "2", "--", sys.executable, "diverge.py", "--epochs", str(EPOCHS)]
    first = flor_replay(rec, *cmd, env=rec.env(KILL_AT="4"))
    assert first.returncode == 1 and "worker 1 (epochs 3-5) failed: killed by SIGKILL" in first.stderr, first.stderr
    second = flor_replay(rec, *cmd)
    assert "resuming: 1 of 2 segments left" in second.stderr, second.stderr
    last = second.stderr.splitlines()[-1]
    assert last.startswith("flor: replay DIVERGED") and last.endswith("exit status 3 (--flor_lenient keeps 0)"), last
    assert second.returncode == 3
