"""``flor replay``: parallel replay on this machine, its plan, and merged reports.

``flor replay NAME -- python train.py ARGS`` plans the segments (``flor.plan``), starts one
worker per segment (through an executor: ``local`` processes, or ``ray`` tasks) with ``FLOR_NAME``,
``FLOR_REPLAY=PID/N``, a shared ``FLOR_REPLAY_ID`` and the recorded run pinned (``FLOR_RUN``),
streams each worker's output with a ``[wN]`` prefix, shows one progress bar (epochs done of all, ETA) read from the
workers' epoch marks (``replay-<id>-<N>.marks.jsonl``, never from the script's output), and
ends with one verification summary merged from the workers' ``*.summary.json``.

Placement. With GPUs each worker sees one (``CUDA_VISIBLE_DEVICES``; workers beyond the GPU
count share them round-robin). On CPU every worker keeps the recorded torch thread count,
because CPU kernels can round differently with another count and replay promises bit-exact
values; the launcher sets ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` to that count too and says
when workers x threads exceed the cores. ``--threads N`` trades exactness for speed.
A recording made under DDP gets ``RANK=0 WORLD_SIZE=1`` and its own ``MASTER_PORT`` per
worker: every worker is a world of one (see ``flor.ddp``).

Failures and resuming. A worker that fails is reported with its segment, exit status and
last lines; the others finish. The launch is kept in ``runs/<run>/logs/launch-<id>.json``;
running the same command again (same script, arguments and worker count) resumes it: a
segment is done when its worker's summary exists with no failure, and only the others run
(``--fresh`` starts over). A worker that cannot start ends the launch (``abort_launches``): the
started ones are stopped, the record says ``failed`` with the reason, and the CLI exits 2.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

from .._fmt import clock, progress, span
from ..errors import ConfigError, FlorError
from ..store.runlogs import retire_worker_files
from ..placement import cores, new_replay_id, pid_alive
from ..redact import redact_argv, redact_command
from ..settings import VERDICT_VARIABLES
from ..store.ids import is_replay_id
from ..plan import select
from ..store import ExperimentStore
from .estimate import ReplayEstimate, estimate_replay, launcher_s, wait_policy
from .executor import Executor
from .output import WorkerOutput, clean
from .records import read_launch_record, read_summary
from .report import merged_summary
from .workers import WorkerState, failure

__all__ = ["Launch", "abort_launches", "detect_gpus", "run_launch", "script_of", "start_error", "stop_workers"]

#: seconds a worker asked to stop may take to end by itself (its summary, a bounded flush)
STOP_GRACE_S = 30.0

_PLACEMENT_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                   "SLURM_PROCID", "SLURM_NTASKS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
                   "SLURM_ARRAY_TASK_MIN", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID")


def detect_gpus(spec: str, env: dict[str, str] | None = None) -> list[str]:
    """GPU ids for the workers: ``none``, a list like ``0,1,3``, or ``auto`` (``CUDA_VISIBLE_DEVICES``
    when set, else what ``nvidia-smi -L`` lists, else none: CPU)."""
    env = dict(os.environ if env is None else env)
    if spec == "none":
        return []
    if spec != "auto":
        gpus = [g.strip() for g in spec.split(",") if g.strip()]
        if not gpus or len(set(gpus)) != len(gpus):
            raise ConfigError(f"--gpus {spec!r}: give distinct GPU ids like 0,1,2, or auto, or none")
        return gpus
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(row for row in out.splitlines() if row.startswith("GPU "))]


def script_of(command: Sequence[str]) -> Path | None:
    for word in command[1:] if len(command) > 1 else command:
        if word.endswith(".py"):
            return Path(word)
    return None


def _sha256(path: Path | None) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None else None
    except OSError:
        return None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (released when the process dies, even by SIGKILL):
    the launches of one run read and claim its launch records one at a time. A folder that
    cannot be opened or locked (missing, or a filesystem without locks) is not locked."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Launch:
    """One ``flor replay`` of a recorded run: its plan, the workers' environment, the resumable
    launch record, progress and the merged conclusion. Where the workers run is the executor's
    business (:mod:`flor.launch.local`, :mod:`flor.launch.ray`), given to :meth:`execute`.

    (needs a recorded run and a training script, so the example is not run as a doctest)

    >>> launch = Launch(store, run, ["python", "train.py"], workers=2, gpus=[], epoch_range=None,
    ...                 strong=False, threads=None, fresh=False, out=sys.stdout, err=sys.stderr)  # doctest: +SKIP
    >>> launch.execute(LocalExecutor())  # doctest: +SKIP
    0
    """

    def __init__(self, store: ExperimentStore, run: str, command: list[str], *, workers: int | None,
                 gpus: list[str], epoch_range: tuple[int, int | None] | None, strong: bool,
                 threads: int | None, fresh: bool, out: TextIO, err: TextIO, keep_finished: bool = False,
                 verdict: str | None = None) -> None:
        self.store, self.run, self.command = store, run, command
        self.verdict = verdict  # --verdict: every worker's FLOR_VERDICT; None: the workers' own (flags, variables)
        self.keep_finished = keep_finished  # a sweep: a run replayed before by the same command is shown, not run
        self.meta = store.read_run(run)
        self.run_dir = store.run_path(run)
        self.layout = store.layout(run)
        self.gpus, self.strong, self.threads = gpus, strong, threads
        self.epoch_range = epoch_range
        self.out, self.err = out, err
        self.script = script_of(command)
        n_epochs = self.meta.epochs
        if n_epochs == 0:
            raise ConfigError(f"run {run} of {store.name} recorded no finished epoch "
                              f"(status {self.meta.status_text()}): "
                              f"there is nothing to replay; `flor show {store.name} {run}` shows what it recorded")
        self.within = select(n_epochs, epoch_range) if epoch_range else None
        if epoch_range and self.within is not None and len(self.within) == 0:
            raise ConfigError(f"--epochs {epoch_range[0]}:{epoch_range[1] if epoch_range[1] is not None else ''} "
                              f"selects no epoch of run {run}, which has epochs 0 to {n_epochs - 1}")
        selected = len(self.within) if self.within is not None else n_epochs
        self.asked = workers  # --workers, when more than the epochs: said in the notes
        if workers and workers > max(1, selected):  # a worker without an epoch would replay nothing
            workers = max(1, selected)
        self.workers = workers
        self.done_before = False  # the launch found finished, every segment done (keep_finished)
        with _locked(self.layout.logs):  # two launches of one command: the second sees the first's claim
            earlier = None if fresh else self._resumable()
            if earlier is not None:  # claimed before it runs, or both would run the same segments
                key = self.store.run_key(run, "logs", self.layout.launch_record(earlier["replay"]).name)
                self.store.write_json(key, {**earlier, "status": "running", "pid": os.getpid(),
                                            "host": socket.gethostname()}, durable=False)
        if earlier is not None:  # resuming: the same segments as before
            workers = int(earlier["workers"])
        elif not workers:
            workers = len(gpus) or estimate_replay(store, run, self.meta, workers=1, script=self.script,
                                                   within=self.within, strong=strong, threads=threads).fastest[0]
        self.workers = workers
        self.estimate: ReplayEstimate = estimate_replay(
            store, run, self.meta, workers=self.workers, script=self.script, within=self.within, strong=strong,
            threads=threads, gpus=gpus)
        self.estimate.launcher_s = launcher_s()
        self.replay_id, self.resumed = ((str(earlier["replay"]), True) if earlier is not None
                                        else (new_replay_id(), False))
        self.states = [WorkerState(w, self.estimate.plans[w]) for w in range(self.workers)]
        self.lock = threading.Lock()  # the output threads and the progress bar share the streams
        self.bar: Any = None  # tqdm's bar while the workers run
        self._said: set[str] = set()  # the workers' notes shown so far: each is shown once
        self.started = time.time()
        self.tag = ""  # before each worker's [wN] prefix: a sweep names the run there
        self.extra_env: dict[str, str] = {}  # a sweep's PYTHONPATH for a transplanted script

    # -- the launch record and resuming ------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        # kept in logs/launch-<id>.json, which may be spooled and shared: secrets hidden
        return {"command": redact_argv(self.command), "script_sha256": _sha256(self.script), "workers": self.workers,
                "epochs": list(self.epoch_range) if self.epoch_range else None, "strong": self.strong,
                "threads": self.threads}

    def _resumable(self) -> dict | None:
        """The newest launch of this run, if it did not finish and ran the same command (the same
        script bytes, selection and options, and worker count when one is given); None otherwise."""
        records = []
        for path in self.layout.launch_records():
            rec = read_launch_record(path)  # None for a file of another shape (one warning)
            if rec is not None and is_replay_id(rec.get("replay")):  # its id names files: checked
                records.append(rec)
        if not records:
            return None
        newest = max(records, key=lambda r: float(r.get("started") or 0))
        wanted = {k: v for k, v in self._identity().items() if k != "workers" or self.workers}
        if any(newest.get(k) != v for k, v in wanted.items()):
            return None
        if newest.get("status") == "finished":
            self.done_before = self.keep_finished
            return newest if self.keep_finished else None
        if newest.get("status") == "running" and newest.get("host") == socket.gethostname() \
                and newest.get("pid") and pid_alive(int(newest["pid"])):
            raise ConfigError(f"replay {newest['replay']} of this run is still running (flor replay, "
                              f"pid {newest['pid']}): wait for it, or start another with --fresh")
        return newest

    def worker_done(self, w: int) -> bool:
        """A segment is done when its worker's summary exists and reports no failure."""
        s = read_summary(self.layout.replay_summary(self.replay_id, w))
        if s is None:
            return False
        plan = self.states[w].plan
        return s.get("exit") is None and s.get("segment") in (None, [plan.segment.start, plan.segment.stop])

    def write_record(self, status: str, summary: dict | None = None, *, error: str | None = None) -> None:
        rec = {
            "replay": self.replay_id, "name": self.store.name, "run": self.run, **self._identity(),
            "gpus": self.gpus, "status": status, "started": self.started, "pid": os.getpid(),
            "host": socket.gethostname(),
            "ended": time.time() if status != "running" else None,
            "estimate_s": round(self.estimate.total_s, 3), "startup_from": self.estimate.startup_from,
            "slowdown": round(self.estimate.slowdown, 3), "busy_cores": round(self.estimate.busy, 2),
            "startup_slowdown": round(self.estimate.startup_slowdown, 3),
            **({"replay_extra_s": extra} if (extra := self._replay_extra()) is not None else {}),
            "segments": [{
                "worker": s.index, "segment": [s.plan.segment.start, s.plan.segment.stop],
                "init": [s.plan.init.start, s.plan.init.stop], "skipped": s.skipped, "rc": s.rc,
                "startup_s": round(fixed, 3) if (fixed := s.fixed_s()) is not None else None,
                "seconds": round(s.exited - s.spawned, 3) if s.exited and s.spawned else None,
                "estimate_s": round(self.estimate.seconds[s.index], 3),
            } for s in self.states],
            "summary": summary,
            **({"error": error} if error else {}),
        }
        self.store.write_json(self.store.run_key(self.run, "logs", self.layout.launch_record(self.replay_id).name), rec,
                              durable=False)

    def _replay_extra(self) -> float | None:
        """What this launch's workers spent outside their epochs beyond the recording's own start-up
        and wind-down (the median worker, per unit of sharing), for the first ``--plan`` of the
        experiment's next runs (``flor.launch.estimate.replay_extra``); None where not measured."""
        recorded = self.estimate.recorded_startup_s
        fixed = sorted(f for s in self.states if not s.skipped and (f := s.fixed_s()) is not None)
        if recorded is None or not fixed:
            return None
        share = max(self.estimate.startup_slowdown, 1.0)
        return round(max(0.0, fixed[len(fixed) // 2] / share - recorded), 3)

    # -- workers -------------------------------------------------------------------------

    def env(self, w: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOR_") or k in (
            "FLOR_HOME", "FLOR_SPOOL", *VERDICT_VARIABLES)}  # how a divergence ends: the user's choice
        if self.verdict is not None:  # --verdict wins over the variables, as a flag does in a worker
            for k in VERDICT_VARIABLES:
                env.pop(k, None)
            env["FLOR_VERDICT"] = self.verdict
        for k in _PLACEMENT_VARS:
            env.pop(k, None)
        env.update({"FLOR_NAME": self.store.name, "FLOR_REPLAY": f"{w}/{self.workers}",
                    "FLOR_REPLAY_ID": self.replay_id, "FLOR_RUN": self.run, "PYTHONUNBUFFERED": "1"})
        if self.epoch_range:
            a, b = self.epoch_range
            env["FLOR_EPOCHS"] = f"{a}:{'' if b is None else b}"
        elif self.meta.status == "running":  # a live recording finishes more epochs meanwhile: the planned ones
            env["FLOR_EPOCHS"] = f"0:{self.meta.epochs}"
        if self.strong:
            env["FLOR_STRONG"] = "1"
        if self.threads:
            env["FLOR_THREADS"] = str(self.threads)
        threads = str(self.estimate.threads)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
        if policy := wait_policy(self.workers or 1, self.estimate.threads, self.gpus):
            env["OMP_WAIT_POLICY"] = policy  # teams that share cores sleep while they wait, not spin
        env["CUDA_VISIBLE_DEVICES"] = self.gpus[w % len(self.gpus)] if self.gpus else ""
        env.update(self.extra_env)
        if int(self.meta.world_size or 1) > 1:  # a DDP recording: each worker a world of one
            env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
        return env

    # -- output and progress ---------------------------------------------------------------

    def _emit(self, stream: TextIO, text: str) -> None:
        """Write ``text`` above the progress bar (tqdm clears it and draws it again below)."""
        with self.lock:
            if self.bar is not None:
                self.bar.clear()
            stream.write(text)
            stream.flush()
            if self.bar is not None:
                self.bar.refresh()

    def pump(self, state: WorkerState) -> None:
        """The one output thread of a worker, whatever runs it: prefix, print and keep its tail."""
        assert state.handle is not None  # started
        view = WorkerOutput(self.replay_id, self._said)  # no bar redraws, no repeated notes, no own summary
        for line in state.handle.lines():
            text = clean(line)
            if text is not None:
                state.tail.append(text)  # a failed worker's last lines: its summary included
            shown = view.show(line)
            if shown is not None:
                self._emit(self.out, f"[{self.tag}w{state.index}] {shown}\n")

    def _eta(self) -> float | None:
        """Seconds until the slowest running worker is done: its own pace so far, else the estimate."""
        now = time.time()
        etas = []
        for s in self.states:
            if s.skipped or s.rc is not None:
                continue
            left = len(s.plan.segment) + len(s.plan.init) - s.completed
            if s.completed and s.last_mark and s.first_epoch:  # the worker's own pace so far
                rate = (s.last_mark - s.first_epoch) / s.completed
                etas.append(max(0.0, left * rate - (now - s.last_mark)))
            else:
                etas.append(max(0.0, self.estimate.seconds[s.index] - (now - s.spawned)))
        return max(etas) if etas else None

    def show_progress(self) -> None:
        """Move the bar to the epochs done (read from the workers' epoch marks) and the ETA."""
        bar = self.bar
        if bar is None or bar.disable:  # not a terminal: no bar, nothing to compute
            return
        done = sum(len(s.plan.segment) if s.skipped else min(s.done_epochs, len(s.plan.segment)) for s in self.states)
        running = sum(1 for s in self.states if s.spawned and s.rc is None)
        eta = self._eta()
        with self.lock:
            bar.n = done
            bar.set_postfix_str(f"{running}/{self.workers} workers running, "
                                f"{'finishing' if eta is None else 'ETA ' + clock(eta)}", refresh=False)
            bar.refresh()

    # -- the whole launch ----------------------------------------------------------------

    def prepare(self) -> list[WorkerState]:
        """Announce the launch, write its record, and return the workers still to run."""
        pending = []
        for s in self.states:
            if len(s.plan.segment) == 0 or (self.resumed and self.worker_done(s.index)):
                s.skipped = True
            else:
                pending.append(s)
        what = (f"epochs {span(self.within)}" if self.within is not None
                else f"all {self.estimate.plans[0].epochs} epochs")
        tail = f", resuming: {len(pending)} of {self.workers} segments left" if self.resumed else ""
        tail += f"; estimated {clock(self.estimate.total_s)}"
        if self.done_before and not pending:
            tail = ": done before by the same command, its results stand (--fresh replays it again)"
        self._emit(self.err, f"flor: replay {self.replay_id} of {self.store.name} run {self.run}: {what}, "
                             f"{self.workers} workers{tail}\n")
        for note in self._placement_notes():
            self._emit(self.err, f"flor: FL503 {note}\n")
        if self.asked and not self.resumed and (slower := self.estimate.slower_than_fewer()) is not None:
            self._emit(self.err, f"flor: FL504 {slower}\n")
        for s in pending:  # an earlier attempt's files go first, so its marks are not read as progress
            retire_worker_files(self.run_dir, self.replay_id, s.index)
        for s in pending:
            gpu = f" on GPU {self.gpus[s.index % len(self.gpus)]}" if self.gpus else ""
            self._emit(self.err, f"flor: worker {s.index}: epochs {span(s.plan.segment)} (initialization "
                                 f"{span(s.plan.init)}){gpu}\n")
        self.write_record("running")
        return pending

    def marks(self, s: WorkerState) -> Path:
        return self.layout.replay_marks(self.replay_id, s.index)

    def execute(self, executor: Executor) -> int:
        """Run the pending workers with ``executor``; the exit status for the CLI (see :meth:`conclude`)."""
        executor.open()
        pending = self.prepare()
        total = sum(len(s.plan.segment) for s in self.states)
        self.bar = progress(total, f"replay {self.replay_id}", stream=self.err, unit="epoch",
                             bar_format="{desc}: |{bar}| {n_fmt}/{total_fmt} epochs{postfix}")  # ETA: ours
        pumps: list[threading.Thread] = []
        for s in pending:
            s.spawned = time.time()
            try:
                s.handle = executor.start(s.index, self.command, self.env(s.index), threads=self.estimate.threads)
            except Exception as exc:  # whatever the executor raised, the record must not stay "running"
                raise abort_launches([self], pending, pumps, start_error(s, exc)) from exc
            pumps.append(threading.Thread(target=self.pump, args=(s,), daemon=True, name=f"flor-w{s.index}"))
            pumps[-1].start()
        try:
            while any(s.rc is None for s in pending):
                time.sleep(0.25)
                self._poll(pending)
                self.show_progress()
        except KeyboardInterrupt:
            stop_workers(pending)
            self._emit(self.err,
                       "\nflor: interrupted; run the same command again to replay only the missing segments\n")
        for t in pumps:  # the workers' last lines; a grandchild holding the pipe open is not waited for
            t.join(timeout=2.0)
        return self.conclude(pending)

    def _poll(self, pending: list[WorkerState]) -> None:
        for s in pending:
            if s.rc is None and s.handle is not None:
                s.read_marks(self.marks(s))
                s.rc = s.handle.poll()
                s.exited = time.time() if s.rc is not None else None

    def conclude(self, pending: list[WorkerState]) -> int:
        """Merge the workers' summaries, print and keep them; 0 done, 1 a worker failed, 3 diverged (strict)."""
        for s in pending:
            s.read_marks(self.marks(s))
        self.show_progress()
        with self.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
        return self.finish(pending)[0]

    def finish(self, pending: list[WorkerState], *, show: bool = True) -> tuple[int, dict[str, Any]]:
        """Merge the workers' summaries, keep them (and print them with ``show``); the exit status
        (0 done, 1 a worker failed, 3 diverged) and the merged summary."""
        failed = [s for s in pending if not (s.rc in (0, 3) and self.worker_done(s.index))]
        summary = merged_summary(self.run_dir, self.replay_id, self.workers,
                                 failures={s.index: failure(s) for s in failed}, header=self._header(),
                                 shown=WorkerOutput(self.replay_id, self._said).notes())
        if show:
            self._emit(self.err, summary["text"] + "\n")
        self.write_record("finished" if not failed else "failed", {k: v for k, v in summary.items() if k != "text"})
        if failed:
            return 1, summary
        earlier = [read_summary(self.layout.replay_summary(self.replay_id, s.index)) or {}  # done before a resume
                   for s in self.states if s.skipped and len(s.plan.segment)]
        diverged = any(s.rc == 3 for s in pending) or any(
            x.get("verdict") == "diverged" and not (x.get("lenient") or self.verdict == "lenient") for x in earlier)
        # what only the merged summary knows makes it not exact too (a new log no worker ran: FL338)
        return (3 if diverged else int(summary.get("exit_status") or 0)), summary

    def _header(self) -> str:
        took = time.time() - self.started
        return (f"flor: replay {self.replay_id} of {self.store.name} run {self.run}: {self.workers} workers, "
                f"{took:.1f} s (estimated {self.estimate.total_s:.1f} s)")

    def _placement_notes(self) -> list[str]:
        notes = []
        t, n = self.estimate.threads, self.workers
        assert n is not None  # the worker count __init__ settled on
        if self.asked and self.asked > n:
            notes.append(f"--workers {self.asked}: {n} epoch(s) to replay, so {n} worker(s)")
        if not self.gpus and n * t > cores():
            notes.append(f"{n} workers x {t} torch thread(s) exceed this machine's {cores()} cores; each worker keeps "
                         f"the recorded thread count for bit-exact values (--threads trades that for speed)"
                         + ("; their OpenMP threads wait passively" if wait_policy(n, t, self.gpus) else ""))
        if self.gpus and n > len(self.gpus):
            notes.append(f"{n} workers share {len(self.gpus)} GPU(s) round-robin")
        if self.threads and self.threads != self.meta.torch_threads:
            notes.append(f"--threads {self.threads}: not the recorded {self.meta.torch_threads}; "
                         "values may differ from the recording in the last bits")
        return notes


def stop_workers(states: Sequence[WorkerState], grace_s: float = STOP_GRACE_S) -> None:
    """Ask every started worker that still runs to end, then wait for each (Ctrl-C, or a launch
    that cannot go on). One that has not ended after ``grace_s`` seconds, or when Ctrl-C comes
    again meanwhile, is stopped at once (a stuck worker, one that ignores SIGTERM): the
    launcher never waits on it for ever."""
    running = [(s, s.handle) for s in states if s.handle is not None and s.rc is None]
    for _, handle in running:
        handle.stop()
    deadline = time.monotonic() + grace_s
    try:
        while time.monotonic() < deadline and any(handle.poll() is None for _, handle in running):
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass  # asked again: no more waiting
    for _, handle in running:
        if handle.poll() is None:
            handle.stop()  # the second time: at once
    for s, handle in running:
        s.rc, s.exited = handle.wait(), time.time()


def start_error(s: WorkerState, exc: BaseException) -> str:
    """Why worker ``s`` could not start, in one line (an OSError from the spawn, an executor's error)."""
    why = str(exc) if isinstance(exc, FlorError) else f"{type(exc).__name__}: {exc}"
    return f"worker {s.index} (epochs {span(s.plan.segment)}) could not start: {' '.join(why.split())}"


def abort_launches(launches: Sequence[Launch], states: Sequence[WorkerState], pumps: Sequence[threading.Thread],
                   reason: str) -> FlorError:
    """End launches whose next worker could not start (the command removed or no longer executable
    since the check, a process limit, an executor's failure): stop the workers already started
    (their segments are not done, so the same command resumes them), record every launch as
    ``failed`` with ``reason``, and return the error for the CLI's one line (exit status 2)."""
    stop_workers(states)
    for t in pumps:
        t.join(timeout=2.0)
    for launch in launches:
        with launch.lock:
            if launch.bar is not None:
                launch.bar.close()
                launch.bar = None
        launch.write_record("failed", error=reason)
    stopped = sum(1 for s in states if s.handle is not None)
    ids = ", ".join(launch.replay_id for launch in launches)
    return FlorError(f"{reason}; {stopped} started worker(s) stopped, launch {ids} recorded as failed: fix that and "
                     "run the same command again to replay the missing segments")


def check_verdict_once(command: Sequence[str], verdict: str | None) -> None:
    """``flor replay --verdict V`` with a verdict flag in the command too: a ConfigError, since
    the command's flag would win in every worker over the ``FLOR_VERDICT`` given to it.

    >>> check_verdict_once(["python", "t.py", "--flor_lenient"], None)
    >>> check_verdict_once(["python", "t.py", "--flor_lenient"], "strict")
    Traceback (most recent call last):
    flor.errors.ConfigError: --verdict strict and --flor_lenient in the command both set the replay's verdict: ...
    """
    if verdict is None:
        return
    for word in command:
        flag = word.partition("=")[0]
        if flag in ("--flor_verdict", "--flor_strict", "--flor_lenient"):
            raise ConfigError(f"--verdict {verdict} and {flag} in the command both set the replay's verdict: "
                              f"give it once, as --verdict (the command was: {redact_command(list(command))})")


def run_launch(store: ExperimentStore, run: str, command: list[str], *, executor: Executor, workers: int | None,
               gpus: list[str], epoch_range: tuple[int, int | None] | None, strong: bool, threads: int | None,
               fresh: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr, verdict: str | None = None) -> int:
    """Replay ``run`` with ``command`` over ``workers`` workers that ``executor`` runs (the CLI
    picks it: :class:`~flor.launch.local.LocalExecutor`, or :class:`~flor.launch.ray.RayExecutor`
    for ``--ray``); the CLI's exit status."""
    if not command:
        raise ConfigError("give the training command after --, e.g. flor replay NAME -- python train.py --epochs 8")
    check_verdict_once(command, verdict)
    for i, word in enumerate(command):
        flag, eq, value = word.partition("=")
        if flag in ("--replay_flor", "--flor_run", "--flor_epochs", "--flor_threads", "--flor_strong"):
            raise ConfigError(f"leave {flag} out of the command: flor replay sets it for each worker "
                              f"(the command was: {redact_command(command)})")
        if flag == "--flor":
            given = value if eq else (command[i + 1] if i + 1 < len(command) else "")
            if given != store.name:
                raise ConfigError(f"the command names --flor {given} but this replays {store.name}; "
                                  "leave --flor out of the command")
    launch = Launch(store, run, command, workers=workers, gpus=gpus, epoch_range=epoch_range, strong=strong,
                    threads=threads, fresh=fresh, out=out, err=err, verdict=verdict)
    return launch.execute(executor)
