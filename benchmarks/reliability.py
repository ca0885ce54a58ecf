"""Reliability: flor never hurts the run it records, and no fault costs what was committed.

Faults, each against a small but real training script (an MLP with Adam, ~16 MB of state
per checkpoint, a checkpoint at every epoch so the background writer is busy most of the time):

- **kill -9 at random instants** across the whole run: start-up, training, background writes,
  the exit flush. After each kill: every manifest reads, its digest holds, every blob it names
  exists and verifies (0 unreadable allowed), and, for a sample of trials, a hindsight replay
  of what exists gives exactly the values of a full run of the edited script.
- **disk full**: the store on a small tmpfs (root) or under RLIMIT_FSIZE (otherwise).
  Training must finish with exactly the output of a run without flor, and the replay be exact.
- **SIGTERM mid-run**: exit status 143 (killed by SIGTERM), status ``terminated``, every
  finished epoch checkpointed or listed as skipped, replay exact.
- **threads logging**: 4 threads log while epochs flush: no record lost or duplicated.
- **odd values**: NumPy steps and values, tensors, objects passed to ``flor.log``.

    python benchmarks/reliability.py [--trials 100] [--replay-every 5] [--no-scenarios] [--out PATH]

Results go to benchmarks/results/reliability.json (or ``--out``); the exit status is 1 when
anything was lost.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import env as bench_env, save, table

NAME = "rel"
EPOCHS = 6

TRAIN = '''\
"""A small training script for the reliability benchmark (written out by reliability.py)."""
import argparse
import threading

import numpy as np
import torch

import flor

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--threads", action="store_true", help="4 threads log while the epoch ends")
parser.add_argument("--odd", action="store_true", help="log NumPy, tensor and object values and steps")
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()
print("READY", flush=True)

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                          torch.nn.ReLU(), torch.nn.Linear(1024, 10))
optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
data, labels = torch.randn(args.steps * 32, 256), torch.randint(0, 10, (args.steps * 32,))
val, val_labels = torch.randn(128, 256), torch.randint(0, 10, (128,))

for epoch in flor.it(range(args.epochs)):
    if flor.SkipBlock.step_into("train"):
        perm = torch.randperm(len(data))
        for i in range(args.steps):
            idx = perm[i * 32:(i + 1) * 32]
            loss = torch.nn.functional.cross_entropy(net(data[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    net, optimizer = flor.SkipBlock.end(net, optimizer)
    with torch.no_grad():
        val_loss = torch.nn.functional.cross_entropy(net(val), val_labels).item()
    flor.log("val_loss", val_loss)
    if args.threads:
        def work(k, epoch=epoch):
            for j in range(2000):
                flor.log(f"thread{k}", j, step=epoch * 2000 + j)
        workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    if args.odd:
        flor.log("np_step", val_loss, step=np.int64(epoch))
        flor.log("np_value", np.float32(val_loss))
        flor.log("tensor_value", torch.tensor(val_loss), step=torch.tensor(epoch))
        flor.log("object_value", object())
        flor.log("list_step", 1.0, step=[epoch])
    # HINDSIGHT
    print(f"epoch {epoch} val_loss {val_loss:.10f}", flush=True)
    if args.sleep:
        import time; time.sleep(args.sleep)
print("LOOP_DONE", flush=True)
'''
HINDSIGHT = '    flor.log("wnorm", float(sum(p.double().norm() for p in net.parameters())))'


class Bench:
    """Scripts, environments and checks, in one scratch folder."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.script = work / "train.py"
        self.script.write_text(TRAIN)
        self.edited = work / "edited.py"
        self.edited.write_text(TRAIN.replace("    # HINDSIGHT", HINDSIGHT))
        self._reference: dict | None = None

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        return bench_env(home, threads=1, FLOR_EVERY="1", **extra)

    def run(self, script: Path, home: Path, *args: str, check: bool = True, preexec: Any = None,
            **extra: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, str(script), "--epochs", str(EPOCHS), *args], cwd=self.work,
                              env=self.env(home, **extra), capture_output=True, text=True, timeout=600,
                              preexec_fn=preexec)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{script.name} {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc

    def logs(self, home: Path, name: str = NAME) -> list[dict]:
        proc = subprocess.run([sys.executable, "-m", "flor", "logs", name], cwd=self.work, env=self.env(home),
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"flor logs failed: {proc.stderr[-2000:]}")
        return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]

    def reference(self) -> dict:
        """{(name, epoch, step): value} of a full run of the edited script."""
        if self._reference is None:
            self.calibrate()
        assert self._reference is not None
        return self._reference

    def calibrate(self) -> float:
        """Record the edited script uninterrupted: its values are the reference every replay
        must match, and its READY-to-exit time the span kill instants are drawn from."""
        home = self.work / "reference"
        _, span = timed_run(self, home, None, self.edited)
        self._reference = values(self.logs(home))
        shutil.rmtree(home, ignore_errors=True)
        return span

    def replay_exact(self, home: Path, epochs_done: int, *args: str) -> tuple[bool, str]:
        """Replay the recording with the hindsight log; compare with the full run's values."""
        proc = self.run(self.edited, home, "--flor", NAME, "--replay_flor", *args, check=False)
        if proc.returncode != 0:
            return False, f"replay exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
        got = values([r for r in self.logs(home) if r["source"] == "replay"])
        want = {k: v for k, v in self.reference().items() if k[1] is not None and k[1] < epochs_done
                and k[0] in ("val_loss", "wnorm")}
        got = {k: v for k, v in got.items() if k[0] in ("val_loss", "wnorm")}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()), key=str)[:4]
            return False, f"replayed values differ from a full run: {diff}"
        return True, ""


def values(records: list[dict]) -> dict[tuple, Any]:
    return {(r["name"], r["epoch"], json.dumps(r["step"])): r["value"] for r in records}


def check_store(home: Path) -> dict[str, Any]:
    """What a crash left: manifests (readable, digest, blobs), run.json, stray temp files."""
    from flor.store import ExperimentStore
    from flor.store.experiment import blob_hashes
    from flor.store.manifest import digest_of

    out: dict[str, Any] = {"manifests": 0, "unreadable_manifests": 0, "bad_blobs": 0, "problems": [],
                           "epochs_done": 0, "status": None, "checkpointed": [], "skipped": [], "failed": []}
    runs_dir = home / NAME / "runs"
    runs = sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []
    if not runs:
        return out
    store, run = ExperimentStore(home, NAME), runs[-1].name
    try:
        meta = json.loads((runs[-1] / "run.json").read_text())
        out.update(epochs_done=meta.get("epochs_done", 0), status=meta.get("status"),
                   skipped=meta.get("checkpoint_skipped", []), failed=meta.get("checkpoint_failures", []))
    except (OSError, ValueError):
        out["status"] = "no run.json"  # killed before its first write: nothing recorded yet
    for block, epoch, occ in store.manifests(run):
        out["manifests"] += 1
        try:
            m = store.read_manifest(run, block, epoch, occ)
            if digest_of(m) != m["digest"]:
                raise ValueError("digest mismatch")
        except Exception as exc:  # noqa: BLE001 - any failure to read is what we count
            out["unreadable_manifests"] += 1
            out["problems"].append(f"{block}/{epoch}: {exc!r}"[:200])
            continue
        for digest in blob_hashes(m):
            try:
                store.blobs.get(digest)
            except Exception as exc:  # noqa: BLE001
                out["bad_blobs"] += 1
                out["problems"].append(f"{block}/{epoch} blob {digest[:12]}: {exc!r}"[:200])
        out["checkpointed"].append(epoch)
    return out


# -- kill -9 -------------------------------------------------------------------------------


def timed_run(b: Bench, home: Path, kill_at: float | None, script: Path | None = None) -> tuple[str, float]:
    """Record, killing the process ``kill_at`` seconds after its READY line; return the phase
    it was in ("before loop", "training", "exit flush", "finished") and the READY-to-end time."""
    proc = subprocess.Popen([sys.executable, str(script or b.script), "--epochs", str(EPOCHS), "--flor", NAME],
                            cwd=b.work, env=b.env(home), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if first.strip() != "READY":
        proc.wait()
        raise RuntimeError(f"the training script did not start: {first!r}")
    ready = time.perf_counter()
    lines: list[str] = []
    if kill_at is None:
        lines = proc.stdout.readlines()
        proc.wait()
        return "finished", time.perf_counter() - ready
    try:
        proc.wait(timeout=kill_at)
        phase = "finished"
    except subprocess.TimeoutExpired:
        proc.kill()  # SIGKILL
        proc.wait()
        phase = ""
    lines = proc.stdout.readlines()
    if not phase:
        phase = "exit flush" if "LOOP_DONE\n" in lines else "training" if lines else "before loop"
    return phase, time.perf_counter() - ready


def kill_trials(b: Bench, trials: int, replay_every: int, rng: random.Random) -> dict[str, Any]:
    span = b.calibrate()  # the READY-to-exit time of an uninterrupted run, kept current below
    phases: dict[str, int] = {}
    totals = {"manifests": 0, "unreadable_manifests": 0, "bad_blobs": 0, "in_flight": 0,
              "replays": 0, "replays_exact": 0}
    lost: list[str] = []
    due = False
    for t in range(trials):
        if t and t % 10 == 0:  # the machine's speed drifts (other work comes and goes): measure again
            span = timed_run(b, b.work / "recalibrate", None)[1]
            shutil.rmtree(b.work / "recalibrate", ignore_errors=True)
        home = b.work / f"trial-{t}"
        kill_at = rng.uniform(0.0, span * 1.02)
        phase, took = timed_run(b, home, kill_at)
        if phase == "finished":
            span = took  # it ran faster than the estimate: sample the faster run from now on
        phases[phase] = phases.get(phase, 0) + 1
        c = check_store(home)
        for k in ("manifests", "unreadable_manifests", "bad_blobs"):
            totals[k] += c[k]
        # finished epochs whose checkpoint was still being written when the process died
        totals["in_flight"] += len(set(range(c["epochs_done"])) - set(c["checkpointed"]))
        lost += [f"trial {t}: {p}" for p in c["problems"]]
        due = due or t % replay_every == 0  # a due replay moves on past trials with nothing to replay
        if due and c["epochs_done"] > 0:
            due = False
            totals["replays"] += 1
            ok, why = b.replay_exact(home, c["epochs_done"])
            totals["replays_exact"] += ok
            if not ok:
                lost.append(f"trial {t} ({phase}, kill at {kill_at:.2f}s, {c['epochs_done']} epochs): {why}")
        shutil.rmtree(home, ignore_errors=True)
        print(f"  trial {t:3d}: kill at {kill_at:5.2f}s ({phase:11s}) epochs {c['epochs_done']} "
              f"manifests {c['manifests']} unreadable {c['unreadable_manifests']} bad blobs {c['bad_blobs']}",
              flush=True)
    return {"trials": trials, "run_span_s": round(span, 3), "killed_in": phases, **totals,
            "lost": len(lost), "lost_detail": lost[:20]}


# -- scenarios -----------------------------------------------------------------------------


def disk_full(b: Bench) -> dict[str, Any]:
    """The store on a 40 MB filesystem: two checkpoints fit, then every write fails."""
    plain = b.run(b.script, b.work / "unused").stdout  # no --flor: the results training must keep
    mnt = b.work / "small-fs"
    mnt.mkdir()
    how, preexec = "tmpfs 40 MB", None
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        how = "RLIMIT_FSIZE 3 MB"  # no tmpfs: every file larger than 3 MB fails to write (EFBIG)

        def preexec() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (3 << 20, 3 << 20))
    try:
        proc = b.run(b.script, mnt, "--flor", NAME, check=False, preexec=preexec)
        c = check_store(mnt)
        res = {"filesystem": how, "exit_status": proc.returncode, "status": c["status"],
               "training_output_identical": proc.stdout == plain, "epochs_done": c["epochs_done"],
               "checkpointed": c["checkpointed"], "failed_checkpoints": len(c["failed"]),
               "unreadable_manifests": c["unreadable_manifests"], "bad_blobs": c["bad_blobs"],
               "stderr_tail": proc.stderr.strip().splitlines()[-3:]}
        if c["epochs_done"]:  # the replay needs room for its logs: lift the limit by copying the store out
            home = b.work / "disk-full-copy"
            shutil.copytree(mnt, home)
            res["replay_exact"], res["replay_problem"] = b.replay_exact(home, c["epochs_done"])
            shutil.rmtree(home, ignore_errors=True)
    finally:
        if how.startswith("tmpfs"):
            subprocess.run(["umount", str(mnt)], capture_output=True)
    res["ok"] = bool(res["exit_status"] == 0 and res["training_output_identical"] and res["status"] == "finished"
                     and res["unreadable_manifests"] == 0 and res["bad_blobs"] == 0 and res.get("replay_exact"))
    return res


def sigterm(b: Bench) -> dict[str, Any]:
    home = b.work / "sigterm"
    proc = subprocess.Popen([sys.executable, str(b.script), "--epochs", str(EPOCHS), "--sleep", "0.3",
                             "--flor", NAME], cwd=b.work, env=b.env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("epoch 2 "):
            proc.send_signal(signal.SIGTERM)
            break
    proc.communicate(timeout=300)
    c = check_store(home)
    covered = set(range(c["epochs_done"])) <= set(c["checkpointed"]) | {s["epoch"] for s in c["skipped"]}
    res = {"exit_status": proc.returncode, "shell_exit_status": 128 - proc.returncode if proc.returncode < 0 else
           proc.returncode, "status": c["status"], "epochs_done": c["epochs_done"], "checkpointed": c["checkpointed"],
           "every_finished_epoch_checkpointed_or_listed": covered, "unreadable_manifests": c["unreadable_manifests"]}
    res["replay_exact"], res["replay_problem"] = b.replay_exact(home, c["epochs_done"])
    res["ok"] = bool(proc.returncode == -signal.SIGTERM and c["status"] == "terminated" and covered
                     and c["unreadable_manifests"] == 0 and res["replay_exact"])
    return res


def threads_logging(b: Bench) -> dict[str, Any]:
    home = b.work / "threads"
    proc = b.run(b.script, home, "--threads", "--flor", NAME, check=False)
    recs = [r for r in b.logs(home) if r["name"].startswith("thread")] if proc.returncode == 0 else []
    keys = [(r["name"], r["step"]) for r in recs]
    expected = 4 * 2000 * EPOCHS
    res = {"exit_status": proc.returncode, "values_logged": expected, "records": len(recs),
           "duplicates": len(keys) - len(set(keys)), "lost": expected - len(set(keys))}
    res["ok"] = proc.returncode == 0 and res["records"] == expected and res["duplicates"] == 0
    return res


def odd_values(b: Bench) -> dict[str, Any]:
    home = b.work / "odd"
    plain = b.run(b.script, b.work / "unused", "--odd").stdout
    proc = b.run(b.script, home, "--odd", "--flor", NAME, check=False)
    recs = b.logs(home) if proc.returncode == 0 else []
    names = {r["name"] for r in recs}
    c = check_store(home)
    res = {"exit_status": proc.returncode, "status": c["status"], "training_output_identical": proc.stdout == plain,
           "logged": sorted(names), "np_step_records": sum(r["name"] == "np_step" for r in recs),
           "warnings": [line for line in proc.stderr.splitlines() if "flor" in line][:6]}
    res["ok"] = bool(proc.returncode == 0 and c["status"] == "finished" and res["training_output_identical"]
                     and res["np_step_records"] == EPOCHS and "val_loss" in names)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100, help="kill -9 trials (default 100)")
    ap.add_argument("--replay-every", type=int, default=5, help="replay every N-th trial (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-scenarios", action="store_true", help="only the kill -9 trials")
    ap.add_argument("--out", type=Path, help="write the results here instead of benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="a smoke test: 5 trials, 1 replayed")
    opts = ap.parse_args()
    if opts.quick:  # a smoke test never replaces the committed figures
        opts.trials, opts.replay_every = 5, 5
        opts.out = opts.out or Path(tempfile.mkdtemp()) / "reliability.json"
    work = Path(tempfile.mkdtemp(prefix="flor-reliability-"))
    t0 = time.perf_counter()
    try:
        b = Bench(work)
        print(f"kill -9 at random instants, {opts.trials} trials", flush=True)
        result: dict[str, Any] = {"epochs": EPOCHS, "kill9": kill_trials(b, opts.trials, max(1, opts.replay_every),
                                                                        random.Random(opts.seed))}
        if not opts.no_scenarios:
            result["scenarios"] = {}
            for name, fn in (("disk_full", disk_full), ("sigterm", sigterm), ("threads_logging", threads_logging),
                             ("odd_values", odd_values)):
                print(f"scenario {name}", flush=True)
                try:
                    result["scenarios"][name] = fn(b)
                except Exception as exc:  # noqa: BLE001 - a scenario that breaks is a finding, not a crash
                    result["scenarios"][name] = {"ok": False, "error": repr(exc)[:500]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    k = result["kill9"]
    print(table([[k["trials"], json.dumps(k["killed_in"]), k["manifests"], k["unreadable_manifests"], k["bad_blobs"],
                  f"{k['replays_exact']}/{k['replays']}", k["lost"]]],
                ["trials", "killed in", "manifests", "unreadable", "bad blobs", "replays exact", "lost"]))
    for name, res in result.get("scenarios", {}).items():
        print(f"{name:16s} {'ok' if res.get('ok') else 'FAILED'}  {json.dumps(res)[:300]}")
    if opts.out:
        from common import machine

        opts.out.write_text(json.dumps({"benchmark": "reliability", "machine": machine(), **result}, indent=1) + "\n")
        print(f"-> {opts.out}")
    else:
        print(f"-> {save('reliability', result)}")
    bad = k["lost"] or k["unreadable_manifests"] or k["bad_blobs"] or k["replays_exact"] != k["replays"] \
        or not all(r.get("ok") for r in result.get("scenarios", {}).values())
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
