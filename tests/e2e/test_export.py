"""Hindsight values where a team already looks: a script that reports to MLflow, W&B and TensorBoard
itself, unguarded, recorded once; replayed with one worker and with two; exported twice.

Checked against the real trackers: MLflow's client on a SQLite store (and on ``mlflow server``),
W&B's offline run files (decoded with W&B's own Record definitions), TensorBoard's event reader.
One tracker run per recording, the recorded history unchanged, the hindsight history equal (==)
to a full re-execution's values, nothing duplicated. ``flor.load`` is compared tensor by tensor
with what a replay restored at that epoch.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import Runner

import mlflow  # the mlflow and wandb extras are in [test]: never skipped
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flor.export.wandb import STEP, history_rows
from flor.store.runlogs import read_run_logs

# a hindsight log in the outer loop; SAVE_AT=E also saves the net's state there (inside the
# flor.log call, so the edit stays logging only): what a replay restored, for flor.load to match
HINDSIGHT = {"        # OUTER": (
    '        flor.log("wnorm", float(sum(p.detach().norm() for p in net.parameters())) + 0 * ('
    'os.environ.get("SAVE_AT") == str(epoch) and torch.save(net.state_dict(), "restored.pt") or 0))')}


def tracker_env(r: Runner, db: Path, **extra: str) -> dict[str, str]:
    return r.env(MLFLOW_TRACKING_URI=f"sqlite:///{db}", TRACKED_WANDB="1", WANDB_SILENT="true", **extra)


def history(c: mlflow.tracking.MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))


def tb_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: sorted((e.step, e.value) for e in acc.Scalars(tag)) for tag in acc.Tags()["scalars"]}


def wandb_runs(cwd: Path) -> list[Path]:
    return sorted(p for p in (cwd / "wandb").glob("offline-run-*") if p.is_dir())


def only_run(r: Runner, name: str) -> tuple[str, Path]:
    [run_dir] = (r.home / name / "runs").iterdir()
    return run_dir.name, run_dir


class Team:
    """A recording of tracked.py, what its trackers held before any replay, and its replay with one worker;
    ``full``: the edited script run in full (its own folder and FLOR_HOME, the same MLflow store)."""

    def __init__(self, tmp: Path) -> None:
        self.r, self.full = Runner(tmp / "team"), Runner(tmp / "full")
        full = self.full
        self.r.cwd.mkdir()
        full.cwd.mkdir()
        self.db = tmp / "mlflow.db"
        self.client = mlflow.tracking.MlflowClient(f"sqlite:///{self.db}")
        self.r.run(self.r.script("tracked.py"), "--flor", "tr", env=tracker_env(self.r, self.db))
        # a full re-execution of the edited script: the hindsight values a replay must give (==)
        full.run(full.script("tracked.py", HINDSIGHT), "--flor", "full",
                 env=full.env(MLFLOW_TRACKING_URI=f"sqlite:///{self.db}"))
        run, run_dir = only_run(full, "full")
        self.full_wnorm = sorted((x["epoch"], x["value"]) for x in read_run_logs(run_dir, run) if x["name"] == "wnorm")
        self.run, run_dir = only_run(self.r, "tr")
        self.notes = json.loads((run_dir / "run.json").read_text())["trackers"]
        self.experiment = self.client.get_experiment_by_name("tracked").experiment_id
        self.runs_before = len(self.client.search_runs([self.experiment]))
        self.acc_before = history(self.client, self.notes["mlflow"]["run_id"], "acc")
        self.tb_before, self.wandb_before = tb_scalars(self.r.cwd / "tb-logs"), wandb_runs(self.r.cwd)
        self.edited = self.r.script("tracked.py", HINDSIGHT, dest="hindsight.py")
        self.one = self.r.run(self.edited, "--flor", "tr", "--replay_flor", "--flor_export", "mlflow,tensorboard,wandb",
                              env=tracker_env(self.r, self.db, SAVE_AT="2"))


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Team:
    return Team(tmp_path_factory.mktemp("export"))


def test_the_recording_notes_where_the_script_reports(team: Team) -> None:
    assert team.notes["mlflow"]["tracking_uri"] == f"sqlite:///{team.db}"
    assert team.notes["tensorboard"]["logdirs"] == [str(team.r.cwd / "tb-logs")]
    assert team.notes["wandb"]["project"] == "tracked" and team.notes["wandb"]["dir"] == str(team.r.cwd)
    assert team.runs_before == 2 and len(team.acc_before) == 4  # this recording's MLflow run and the full run's


def test_replays_add_no_tracker_run_and_exports_put_hindsight_values_in_once(team: Team) -> None:
    r, c, run_id = team.r, team.client, team.notes["mlflow"]["run_id"]
    assert "replay verified exact" in team.one.stderr, team.one.stderr
    assert team.one.stderr.count("wrote 4 value(s) (4 hindsight), 4 already there") == 3, team.one.stderr
    two = subprocess.run([sys.executable, "-m", "flor", "replay", "tr", "--workers", "2", "--export", "mlflow", "--",
                          sys.executable, str(team.edited)], cwd=r.cwd, env=tracker_env(r, team.db),
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr
    assert "wrote 0 value(s) (0 hindsight), 8 already there" in two.stderr  # the first replay's export had them
    again = r.flor("export", "tr", "--to", "tensorboard,wandb").stdout
    assert again.count("wrote 0 value(s) (0 hindsight), 8 already there") == 2, again

    # MLflow: still one run per recording; the recorded history as it was; the hindsight one a full run's
    assert len(c.search_runs([team.experiment])) == team.runs_before
    assert history(c, run_id, "acc") == team.acc_before
    assert history(c, run_id, "wnorm") == team.full_wnorm
    # TensorBoard: the script's own events unchanged beside one new file; each (tag, step) once
    scalars = tb_scalars(r.cwd / "tb-logs")
    assert scalars["acc"] == team.tb_before["acc"] and [s for s, _ in scalars["acc"]] == [0, 1, 2, 3]
    assert [s for s, _ in scalars["wnorm"]] == [0, 1, 2, 3]
    assert [v for _, v in scalars["wnorm"]] == pytest.approx([v for _, v in team.full_wnorm])  # float32 there
    assert len(list((r.cwd / "tb-logs").glob("*.flor"))) == 1
    script_events = sorted((r.home / "tr" / "runs" / team.run / "tb").glob("replay-*/script-*/events.*"))
    assert len(script_events) == 3  # the replays' own SummaryWriter: one a worker, in the replay's folder
    # W&B: the replays made no offline run; the first export one more, resuming the recorded run's id
    runs = wandb_runs(r.cwd)
    assert len(team.wandb_before) == 1 and len(runs) == 2 and runs[-1].name.endswith(team.notes["wandb"]["id"])
    rows = [row for path in runs for row in history_rows(next(path.glob("run-*.wandb"))) if STEP in row]
    assert sorted((row[STEP], row["wnorm"]) for row in rows) == team.full_wnorm


def test_load_restores_what_a_replay_restored_tensor_by_tensor(team: Team, tmp_path: Path) -> None:
    check = tmp_path / "check.py"
    check.write_text(
        "import torch, flor\n"
        "net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 2))\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "print([str(c.epoch) for c in flor.checkpoints('tr')])\n"
        "got, _ = flor.load('tr', 2, into=(net, opt), block='train')\n"
        f"want = torch.load({str(team.r.cwd / 'restored.pt')!r})\n"
        "assert got is net and list(want) == list(net.state_dict())\n"
        "print(all(torch.equal(want[k], v) for k, v in net.state_dict().items()))\n"
        "try:\n    flor.load('tr', 9, into=(net, opt))\n"
        "except flor.CheckpointError as exc:\n    print('refused:', exc)\n")
    out = team.r.run(check).stdout.splitlines()
    assert out[0] == str(["0", "1", "2", "3"]) and out[1] == "True", out
    assert out[2].startswith("refused:") and "epochs 0, 1, 2, 3" in out[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_export_through_mlflow_server_fills_the_recorded_run_once(team: Team, tmp_path: Path) -> None:
    """The full run's own MLflow run, reached through ``mlflow server`` on 127.0.0.1 (its store the same
    SQLite file, so its recorded run id is there)."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{team.db}", "--workers", "1"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**team.full.env(), "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # no job pool
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:  # the server listens once its app has started
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "mlflow server did not start"
                time.sleep(0.5)
        outs = [team.full.flor("export", "full", "--to", "mlflow", "--tracking-uri", uri).stdout for _ in range(2)]
        assert "wrote 4 value(s) (0 hindsight), 4 already there" in outs[0], outs  # acc: the script logged it
        assert "wrote 0 value(s) (0 hindsight), 8 already there" in outs[1], outs
        run, run_dir = only_run(team.full, "full")
        run_id = json.loads((run_dir / "run.json").read_text())["trackers"]["mlflow"]["run_id"]
        c = mlflow.tracking.MlflowClient(uri)
        logged = read_run_logs(run_dir, run)
        for name in ("acc", "wnorm"):
            assert history(c, run_id, name) == sorted((x["epoch"], x["value"]) for x in logged if x["name"] == name)
        assert len(c.search_runs([team.experiment])) == team.runs_before
    finally:
        server.terminate()
        server.wait(timeout=30)
