"""``flor`` subcommands: replay: parallel replay on this machine, --plan, --report."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
from typing import TYPE_CHECKING, Any

from ..errors import FlorError
from ..settings import MAX_WORKERS, SETTINGS, VERDICTS, validate_name
from ..store import ExperimentStore

from .common import subcommand

if TYPE_CHECKING:
    from ..launch.executor import Executor


def cmd_replay(args: argparse.Namespace) -> int:
    from ..launch.estimate import estimate_replay, launcher_s
    from ..launch.launcher import script_of, detect_gpus, run_launch
    from ..launch.report import print_plan, replay_report
    from ..plan import select
    from ..settings import parse_epoch_range

    store = ExperimentStore(SETTINGS.home, validate_name(args.name))
    if args.all or args.runs or args.where:
        return _cmd_sweep(args, store)
    if args.trust:
        raise FlorError("--trust RUN:DIGEST runs an unsigned run of a sweep: use it with --all, --runs or --where")
    if args.dry_run:
        raise FlorError("--dry-run shows a sweep's patches: use it with --all, --runs or --where")
    run, picked = store.replay_run(args.run)
    if picked:
        print(f"flor: {picked}", file=sys.stderr)
    if args.report is not None:
        rep = replay_report(store, run, None if args.report == "latest" else args.report)
        print(json.dumps({k: v for k, v in rep.items() if k != "text"}, indent=1, default=str) if args.json
              else rep["text"])
        return 0 if not rep["missing"] else 1
    _check_workers_and_gpus(args)
    gpus = detect_gpus(args.gpus)
    epoch_range = parse_epoch_range(args.epochs, "--epochs") if args.epochs else None
    command = list(args.cmd or [])
    args.threads = _replay_threads(args, store, run, gpus, epoch_range, command)
    if args.plan:
        meta = store.read_run(run)
        n_epochs = meta.epochs
        within = select(n_epochs, epoch_range) if epoch_range else None
        kw = dict(script=script_of(command), within=within, strong=args.strong, threads=args.threads, gpus=gpus)
        workers = args.workers or (len(gpus) if gpus else estimate_replay(store, run, meta, workers=1, **kw).fastest[0])
        est = estimate_replay(store, run, meta, workers=workers, **kw)
        est.launcher_s = launcher_s()  # what this process took to get here, as the launch will
        if args.json:
            print(json.dumps({"run": run, "workers": workers, "estimate_s": round(est.total_s, 3),
                              "seconds": [round(x, 3) for x in est.seconds], "launcher_s": est.launcher_s,
                              "startup_s": round(est.startup_s, 3),
                              "startup_from": est.startup_from, "fastest": list(est.fastest),
                              "by_count": est.by_count,
                              "probed": sorted(est.probed) if est.probed is not True else True,
                              "segments": [[p.segment.start, p.segment.stop] for p in est.plans],
                              "init": [[p.init.start, p.init.stop] for p in est.plans]}, indent=1))
        else:
            print_plan(est, name=args.name, run=run, meta=meta, gpus=gpus, within=within, out=sys.stdout)
            if not command:
                print("  (no command given: blocks counted as not probed; add -- python SCRIPT.py ARGS to check)")
        return 0
    if args.ray is None:
        _check_command(command)
    _stop_on_termination()
    from ..settings import parse_export

    if args.export is None and SETTINGS.export_error:
        raise FlorError(SETTINGS.export_error)
    targets = parse_export(args.export, "--export") if args.export is not None else SETTINGS.export
    status = run_launch(store, run, command, executor=_executor(args.ray), workers=args.workers, gpus=gpus,
                        epoch_range=epoch_range, strong=args.strong, threads=args.threads, fresh=args.fresh,
                        verdict=args.verdict)
    if targets:  # once, after every worker: the launch's values together, never one worker's half
        from ..export import export_run

        for target in targets:
            print(f"flor: {export_run(store, run, target).line()}", file=sys.stderr)
    return status


def _cmd_sweep(args: argparse.Namespace, store: ExperimentStore) -> int:
    """``--all``/``--runs``/``--where``: every selected run with its own arguments, one pool, one table."""
    from ..launch.launcher import check_verdict_once, detect_gpus
    from ..launch.sweep import plan_sweep, print_dry_run, run_sweep, select_runs

    for flag, given in (("--run", args.run), ("--epochs", args.epochs), ("--plan", args.plan),
                        ("--report", args.report)):
        if given:
            raise FlorError(f"{flag} replays or shows one run; leave it out with --all, --runs or --where")
    _check_workers_and_gpus(args)
    threads = None
    if args.threads is not None:
        if not args.threads.isdigit() or int(args.threads) < 1:
            raise FlorError(f"--threads {args.threads!r}: give a number of threads like 2 (auto is for one run)")
        threads = int(args.threads)
    if args.ray is None and not args.dry_run:
        _check_command(list(args.cmd or []))
    check_verdict_once(list(args.cmd or []), args.verdict)
    runs = select_runs(store, every=args.all, runs=args.runs or [], where=args.where or [])
    plan = plan_sweep(store, runs, list(args.cmd or []), config_dir=SETTINGS.config_dir, trusted=args.trust or [])
    if args.dry_run:
        print_dry_run(store, plan, _script_name(args.cmd), sys.stdout)
        return 0 if not any(sr.skipped for sr in plan) else 1
    _stop_on_termination()
    return run_sweep(store, plan, executor=_executor(args.ray), workers=args.workers, gpus=detect_gpus(args.gpus),
                     strong=args.strong, threads=threads, fresh=args.fresh, verdict=args.verdict)


def _stop_on_termination() -> None:
    """SIGTERM and SIGHUP (``kill``, a closed terminal, a scheduler) end a launch as Ctrl-C does:
    the workers are stopped and awaited and the launch record says it failed, so the same command
    resumes it. Python's default ended the launcher alone: its workers ran on, unwatched, beside
    the resumed launch's. A signal ignored (``nohup``) stays ignored."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, interrupt)


#: a GPU as CUDA_VISIBLE_DEVICES names it: an index, or a GPU-/MIG- UUID as nvidia-smi -L prints it
_GPU_ID_RE = re.compile(r"^(\d+|(GPU|MIG)-[A-Za-z0-9][A-Za-z0-9/-]*)$")


def _check_workers_and_gpus(args: argparse.Namespace) -> None:
    """``--workers`` within 1..MAX_WORKERS and ``--gpus`` auto, none or distinct GPU ids, checked
    before anything is planned or written."""
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        raise FlorError(f"--workers {args.workers}: give a count from 1 to {MAX_WORKERS}")
    spec = args.gpus
    if spec in ("auto", "none"):
        return
    ids = [g.strip() for g in spec.split(",") if g.strip()]  # "0,1," is 0 and 1, as detect_gpus reads it
    bad = next((g for g in ids if not _GPU_ID_RE.match(g)), None) if ids else spec
    if bad is not None or len(set(ids)) != len(ids):
        what = f"{bad!r} is not a GPU id" if bad is not None else "a GPU id is repeated"
        raise FlorError(f"--gpus {spec!r}: {what}; give distinct GPU indices like 0,1,2 (or GPU-/MIG- UUIDs), "
                        "auto, or none for CPU")


def _check_command(command: list[str]) -> None:
    """The program that starts each worker must exist here: else one line, before a launch is written."""
    if not command:
        return  # run_launch says to give one
    prog = command[0]
    if os.sep in prog or (os.altsep and os.altsep in prog):
        if not os.path.isfile(prog):
            raise FlorError(f"command not found: {prog!r} (no such file); check the path after --")
        if not os.access(prog, os.X_OK):
            raise FlorError(f"command not runnable: {prog!r} is not executable; chmod +x it, "
                            f"or run it through its interpreter (-- python {prog} ...)")
    elif shutil.which(prog) is None:
        raise FlorError(f"command not found: {prog!r} is not on PATH; check its spelling after --, "
                        f"e.g. flor replay NAME -- python train.py")


def _script_name(cmd: list[str] | None) -> str:
    return next((w for w in cmd or [] if w.endswith(".py")), "script.py")


def _executor(ray: str | None) -> Executor:
    """``--ray [ADDRESS]``: Ray tasks (no address: ``RAY_ADDRESS``, else a local Ray); else processes here."""
    if ray is not None:
        from ..launch.ray import RayExecutor

        return RayExecutor(ray or None)
    from ..launch.local import LocalExecutor

    return LocalExecutor()


def _replay_threads(args: argparse.Namespace, store: ExperimentStore, run: str, gpus: list[str],
                    epoch_range: tuple[int, int | None] | None, command: list[str]) -> int | None:
    """``--threads``: a number, or ``auto`` (the cores divided among the workers)."""
    from ..launch.estimate import estimate_replay
    from ..placement import cores
    from ..launch.launcher import script_of
    from ..plan import select

    if args.threads is None:
        return None
    if args.threads != "auto":
        if not args.threads.isdigit() or int(args.threads) < 1:
            raise FlorError(f"--threads {args.threads!r}: give a number of threads like 2, or auto")
        return int(args.threads)
    workers = args.workers or len(gpus)
    if not workers:  # the fastest count with one thread a worker
        meta = store.read_run(run)
        n = meta.epochs
        workers = estimate_replay(store, run, meta, workers=1, script=script_of(command), threads=1, gpus=gpus,
                                  within=select(n, epoch_range) if epoch_range else None).fastest[0]
        args.workers = workers
    return max(1, cores() // workers)


def add_replay_command(sub: Any) -> None:
    """replay: parallel replay on this machine, its plan, and merged reports."""
    p = subcommand(sub, "replay",
                   "replay a recorded run with several workers on this machine, and merge their results", """\
  flor replay cnn-demo -- python train.py --epochs 8          workers: one a GPU, or the fastest count on CPU
  flor replay cnn-demo --workers 2 -- python train.py --epochs 8
  flor replay cnn-demo --gpus 0,1,2,3 --epochs 40:61 -- python train.py   epochs 40 to 60 only
  flor replay cnn-demo --plan --workers 8 -- python train.py  segments and estimated time; runs nothing
  flor replay cnn-demo --report                               merged summary of the newest replay (torchrun, Slurm...)
  flor replay cnn-demo --ray --workers 8 -- python train.py   one Ray task a segment
  flor replay cnn-sweep --all --workers 4 -- python train.py  every run with its own arguments, one table
  flor replay cnn-sweep --where lr=0.001 --dry-run -- python train.py   each run's argv, diff and signature
Run the same command again after a failure: only the missing segments replay. See docs/parallel.md.
""")
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.usage = "flor replay NAME [options] [-- COMMAND ...]"
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: one per GPU; on CPU the count --plan finds fastest)")
    p.add_argument("--gpus", default="auto",
                   help="GPU ids like 0,1,2; auto (default: CUDA_VISIBLE_DEVICES, else nvidia-smi); none for CPU")
    p.add_argument("--epochs", default=None, metavar="A:B",
                   help="replay only epochs A..B-1 (a Python slice: 40:61, 40:, :10, 7), from the nearest checkpoints")
    p.add_argument("--strong", action="store_true", help="initialize every worker from epoch 0")
    p.add_argument("--verdict", choices=VERDICTS, default=None,
                   help="how the workers end (FLOR_VERDICT): strict also fails a worker on state it cannot restore; "
                        "default exits 3 when values diverged; lenient exits 0 then (default: FLOR_VERDICT, "
                        "FLOR_STRICT or FLOR_LENIENT as set, else default)")
    p.add_argument("--threads", default=None, metavar="N|auto",
                   help="torch threads per worker instead of the recorded count (not bit-exact); "
                        "auto: this machine's cores divided among the workers")
    p.add_argument("--run", default=None, help="a run id or unique prefix; default: the latest")
    p.add_argument("--export", default=None, metavar="TRACKER",
                   help="after the replay, export the run's values to mlflow, wandb or tensorboard (flor export; "
                        "default: FLOR_EXPORT)")
    p.add_argument("--fresh", action="store_true", help="start a new replay instead of resuming an unfinished one")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the workers as Ray tasks, one a segment (num_gpus=1 each on a GPU cluster); "
                        "ADDRESS or RAY_ADDRESS joins a cluster, else a local Ray starts (pip install ray)")
    p.add_argument("--plan", action="store_true", help="print the segments and estimated times, and run nothing")
    p.add_argument("--report", nargs="?", const="latest", default=None, metavar="REPLAY_ID",
                   help="print the merged summary of a replay (default: the newest), however it was launched")
    p.add_argument("--json", action="store_true", help="--plan and --report as JSON")
    p.add_argument("--all", action="store_true",
                   help="replay every run, each with its own recorded arguments (the command gives only "
                        "the interpreter and script); see docs/sweeps.md")
    p.add_argument("--runs", nargs="+", default=None, metavar="RUN", help="replay these runs (ids or prefixes)")
    p.add_argument("--where", action="append", default=None, metavar="HP=VALUE",
                   help="replay the runs whose recorded hyperparameter HP equals VALUE (JSON-typed); repeat to AND")
    p.add_argument("--dry-run", action="store_true",
                   help="with --all/--runs/--where: print what each run would run and the patch of each "
                        "older script that gets today's logging; run nothing")
    p.add_argument("--trust", action="append", default=None, metavar="RUN:DIGEST",
                   help="replay this run of a sweep although its recorded script and arguments are not signed by "
                        "a key you trust: the token --dry-run prints beside what it shows (repeat for more runs)")
    p.set_defaults(func=cmd_replay, cmd=[])
