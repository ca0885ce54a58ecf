"""Distributed training and torchrun: a DDP script recorded under torchrun (2 processes,
gloo, CPU) records once and replays with any number of workers; torchrun places replay
workers that share one replay id."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

from helpers import Runner, values
from flor.store.runlogs import read_run_logs

EPOCHS = 4
OUTER = {"    # OUTER": '    flor.log("wnorm", float(sum(p.detach().double().norm() for p in net.parameters())))'}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(r: Runner, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    # a port of its own: torchrun's default 29500 may be taken by another test running beside it
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), script, *args],
                          cwd=r.cwd, env=r.env(**env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> Runner:
    r = Runner(tmp_path_factory.mktemp("ddp"))
    r.script("ddp.py")
    r.script("ddp.py", edits=OUTER, dest="ddp_outer.py")
    r.record = torchrun(r, "ddp.py", "--epochs", str(EPOCHS), "--flor", "ddp")
    return r


def test_ddp_recording_is_one_run_with_every_rank_logged(ddp):
    runs = list((ddp.home / "ddp" / "runs").iterdir())
    assert len(runs) == 1  # both ranks, one recording
    run = runs[0]
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["world_size"] == 2
    assert sorted(p.name for p in (run / "checkpoints" / "training_loop").iterdir()) == \
        [f"{e}.json" for e in range(EPOCHS)]  # written once, by rank 0
    # the rank-dependent `stats` (end() argument 3) is caught by the fingerprints; the model,
    # optimizer and step (arguments 0-2) are identical across ranks
    assert {m["arguments"][0] for m in meta["rank_mismatches"]} == {3}
    assert "differs between rank 0 and rank(s) [1] in end() argument(s) 3 (dict)" in ddp.record.stderr
    logs = read_run_logs(run, run.name, ranks=True)
    by_rank = {r: [x["value"] for x in logs if x["name"] == "rank" and x["rank"] == r] for r in (0, 1)}
    assert by_rank == {0: [0] * EPOCHS, 1: [1] * EPOCHS}
    accs = {r: [x["value"] for x in logs if x["name"] == "acc" and x["rank"] == r] for r in (0, 1)}
    assert accs[0] == accs[1]  # DDP kept the models identical
    default = read_run_logs(run, run.name)  # the run's values: rank 0's, untagged
    assert len([x for x in default if x["name"] == "acc"]) == EPOCHS and not any("rank" in x for x in default)
    assert (run / "stdout-rank1.log").read_text().count("rank 1 epoch") == EPOCHS


def test_ddp_run_replays_with_two_workers_and_with_one(ddp):
    two = subprocess.run([sys.executable, "-m", "flor", "replay", "ddp", "--workers", "2", "--", sys.executable,
                          "ddp_outer.py", "--epochs", str(EPOCHS)], cwd=ddp.cwd, env=ddp.env(),
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stdout + two.stderr
    assert "flor: replay verified exact: 4 blocks restored" in two.stderr
    one = ddp.run(ddp.cwd / "ddp_outer.py", "--epochs", str(EPOCHS), "--flor", "ddp", "--replay_flor")
    assert "replay verified exact" in one.stderr  # acc and rank logged again equal rank 0's recording
    logs = ddp.logs("ddp")
    by_replay: dict[str, dict] = {}
    for x in logs:
        if x["source"] == "replay":
            by_replay.setdefault(x["replay"], {})[(x["name"], x["epoch"])] = x["value"]
    assert len(by_replay) == 2
    a, b = by_replay.values()
    assert a == b and {k for k in a if k[0] == "wnorm"} == {("wnorm", e) for e in range(EPOCHS)}


def test_torchrun_places_replay_workers_with_one_replay_id(ddp):
    """A plain (non-DDP) script replayed under torchrun: RANK/WORLD_SIZE place the workers, and
    torchrun's store gives them one replay id (TORCHELASTIC_RUN_ID is 'none' here)."""
    ddp.run(ddp.script("toy.py"), "--epochs", "4", "--flor", "toy")
    outer = ddp.script("toy.py", edits={"    # OUTER": '    flor.log("wnorm", float(net[0].weight.detach().sum()))'},
                       dest="toy_outer.py")
    proc = torchrun(ddp, outer.name, "--epochs", "4", "--flor", "toy", "--replay_flor")
    assert "worker 1/2: epochs 2-3 (initialization epochs 1-1)" in proc.stdout + proc.stderr
    run = next((ddp.home / "toy" / "runs").iterdir())
    replays = {x["replay"] for x in read_run_logs(run, run.name) if x["source"] == "replay"}
    assert len(replays) == 1
    report = subprocess.run([sys.executable, "-m", "flor", "replay", "toy", "--report"], cwd=ddp.cwd, env=ddp.env(),
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "flor: replay verified exact: 4 blocks restored" in report.stdout
    full = ddp.run(outer, "--epochs", "4", "--flor", "toy-full")
    assert values([x for x in read_run_logs(run, run.name) if x["source"] == "replay"]) == \
        values(ddp.logs("toy-full"), "record")
    assert full.returncode == 0


GROUP_FREED = '''
import gc, weakref
import torch
import torch.distributed as dist
import flor

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(3)
for epoch in flor.it(range(2)):
    if flor.SkipBlock.step_into("block"):
        g = torch.ones(3)
        dist.all_reduce(g)
        w += g
    w = flor.SkipBlock.end(w)
    flor.log("w", float(w.sum()))
pg = weakref.ref(dist.group.WORLD)
dist.destroy_process_group()
gc.collect()
print(f"rank {rank} process group freed: {pg() is None}")
'''


def test_flor_holds_no_process_group_past_destroy_process_group(tmp_path):
    """flor's fingerprint check must not keep the script's process group alive: one held past
    ``destroy_process_group`` is freed at interpreter exit, where gloo's threads can abort the
    rank (CI saw 'terminate called without an active exception', SIGABRT, on rank 1)."""
    r = Runner(tmp_path)
    (tmp_path / "group_freed.py").write_text(GROUP_FREED)
    proc = torchrun(r, "group_freed.py", "--flor", "freed")
    # the ranks share torchrun's stdout: one rank's line can land inside the other's
    assert sorted(re.findall(r"rank \d process group freed: \w+", proc.stdout)) == \
        ["rank 0 process group freed: True", "rank 1 process group freed: True"]
    logs = read_run_logs(next((r.home / "freed" / "runs").iterdir()), "x", ranks=True)
    assert sorted((x.get("rank", 0), x["epoch"], x["value"]) for x in logs if x["name"] == "w") == \
        [(0, 0, 6.0), (0, 1, 12.0), (1, 0, 6.0), (1, 1, 12.0)]  # 3 elements, 2 ranks, 2 epochs
