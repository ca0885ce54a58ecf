"""The ``flor`` command: one function per subcommand. Errors exit 2 with one line."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .errors import FlorError
from .logs import FIELDS
from .settings import SETTINGS, validate_name
from .store import ExperimentStore

__all__ = ["main"]

EPILOG = """examples:
  flor ls                               experiments under FLOR_HOME (~/.flor)
  flor ls cnn-demo                      its runs: status, epochs, checkpoints, size
  flor logs cnn-demo                    the latest run's values, one JSON object a line
  flor logs cnn-demo --run all --format csv > logs.csv
  flor logs cnn-demo --format table           one row per epoch, hindsight columns marked
  flor show cnn-demo                          one run: config, status, checkpoints, values
  flor plot cnn-demo val_acc -o acc.png       curves against epoch, runs overlaid
  flor compare cnn-demo --by lr --metric val_acc      mean ± std over seeds, ranked
  flor metrics cnn-demo --definitions defs.json       regex metrics from printed lines
  flor replay cnn-demo --workers 2 -- python train.py  parallel replay; --plan to estimate first
Every command takes --help.
"""


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def cmd_ls(args: argparse.Namespace) -> int:
    home: Path = SETTINGS.home
    if args.name is None:
        names = sorted(p.name for p in home.iterdir() if (p / "runs").is_dir()) if home.is_dir() else []
        if not names:
            print(f"no experiments under {home}; record one with: python train.py --flor NAME")
            return 0
        print(f"{'experiment':<24} {'runs':>4}  {'latest run':<30} {'size':>9}")
        for name in names:
            store = ExperimentStore(home, name)
            runs = store.runs()
            print(f"{name:<24} {len(runs):>4}  {runs[-1] if runs else '-':<30} {_size(store.disk_usage()):>9}")
        return 0
    store = ExperimentStore(home, validate_name(args.name))
    runs = store.runs()
    if not runs:
        raise FlorError(f"no experiment {args.name!r} under {home}; `flor ls` lists them")
    print(f"{'run':<30} {'status':<11} {'started (UTC)':<19} {'epochs':>6} {'ckpts':>5} {'ckpt size':>10}")
    for run in runs:
        meta = store.read_run(run)
        manifests = list(store.manifests(run))
        size = 0
        for block, epoch, occ in manifests:
            size += int(store.read_manifest(run, block, epoch, occ).get("new_bytes", 0))
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(meta.get("started", 0)))
        print(f"{run:<30} {meta.get('status', '?'):<11} {started:<19} {meta.get('epochs_done', 0):>6} "
              f"{len(manifests):>5} {_size(size):>10}")
    return 0


def _hparams(name: str, runs: list[str]) -> dict[str, dict]:
    from .analysis.frame import hyperparameters, open_experiment

    store = open_experiment(name)
    return {r: hyperparameters(store, r) for r in runs}


def _check_metrics(rows: list[dict], wanted: list[str] | None, what: str) -> list[dict]:
    if not wanted:
        return rows
    names = {r["name"] for r in rows}
    unknown = [m for m in wanted if m not in names]
    if unknown:
        raise FlorError(f"{unknown[0]!r} is not among the {what}; they are: {', '.join(sorted(names)) or 'none'}")
    return [r for r in rows if r["name"] in wanted]


_LEGEND = "* hindsight: values a replay logged that the recording does not have"


def _emit(args: argparse.Namespace, rows: list[dict], fields: list[str]) -> None:
    """Write records as the long (one value a line) or wide (one row per epoch/step) layout."""
    from .analysis.frame import mark_hindsight, wide
    from .analysis.output import write_rows
    from .logs import merge_newest

    runs = list(dict.fromkeys(r["run"] for r in rows))
    hp = _hparams(args.name, runs)
    if args.format == "table" or args.wide:
        merged = mark_hindsight(merge_newest(rows), rows)
        columns, table, hindsight = wide(merged, hp, args.metric or ())
        if args.format == "table":
            constant = {k: v for k, v in (hp[runs[0]] if runs else {}).items()
                        if all(h.get(k) == v for h in hp.values()) and len(runs) > 1}
            if constant:
                columns = [c for c in columns if c not in constant]
                print("# the same in every run: " + " ".join(f"{k}={v}" for k, v in constant.items()))
            if all(r.get("step") is None for r in table):
                columns.remove("step")
        write_rows(sys.stdout, columns, table, args.format, marked=hindsight, legend=_LEGEND)
        return
    if args.newest:
        rows = mark_hindsight(merge_newest(rows), rows)
    names = list(dict.fromkeys(k for h in hp.values() for k in h))
    for r in rows:
        r["hparams"] = hp.get(r["run"], {})
        for k in names:
            r[f"hp.{k}"] = r["hparams"].get(k)
    from .analysis.output import write_rows

    if args.format == "jsonl":
        write_rows(sys.stdout, [*fields, "hparams"], rows, "jsonl")
    else:
        write_rows(sys.stdout, [*fields, *(f"hp.{k}" for k in names)], rows, "csv")


def cmd_logs(args: argparse.Namespace) -> int:
    from .analysis import records

    rows = _check_metrics(records(args.name, run=args.run), args.metric, f"names {args.name} logged")
    _emit(args, rows, FIELDS)
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from .analysis.frame import open_experiment, select_runs
    from .analysis.metrics import analytics, extract, load_definitions
    from .analysis.output import write_rows

    defs = load_definitions(args.definitions)
    store = open_experiment(args.name)
    rows: list[dict] = []
    for run in select_runs(store, args.run):
        rows.extend(extract(store.run_path(run), run, defs))
    rows = _check_metrics(rows, args.metric, "metrics the definitions found in the printed output")
    if args.format == "analytics":
        cols = ["timestamp", "metric_name", "value", "epoch", "run", "source", "replay"]
        write_rows(sys.stdout, cols, analytics(rows), "csv")
        return 0
    _emit(args, rows, [*FIELDS, "timestamp"])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from .analysis.show import render_report, run_report

    rep = run_report(args.name, args.run)
    if args.json:
        print(json.dumps(rep, indent=1, default=str))
    else:
        print(render_report(rep))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from .analysis import plot_metrics

    paths = plot_metrics(args.name, args.metric, runs=args.runs, x=args.x, out=args.output,
                         definitions=args.definitions, title=args.title)
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


def _epoch_or_word(text: str) -> str | int:
    if text in ("final", "best"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use final, best or an epoch number") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from .analysis import compare, plot_comparison
    from .analysis.compare import render, table_rows
    from .analysis.output import write_rows

    c = compare(args.name, by=args.by, metric=args.metric, at=args.at, goal=args.goal, runs=args.runs,
                x=args.x, definitions=args.definitions, unfinished=args.unfinished)
    if args.format == "table":
        print(render(c))
    elif args.format == "json":
        print(json.dumps({"metric": c.metric, "by": c.by, "at": c.at, "goal": c.goal,
                          "groups": table_rows(c), "excluded": c.excluded}, indent=1))
    else:
        rows = table_rows(c)
        write_rows(sys.stdout, list(rows[0]) if rows else ["rank", *c.by], rows, "csv")
    if args.plot is not None:
        for p in plot_comparison(c, out=args.plot):
            print(f"wrote {p}", file=sys.stderr if args.format != "table" else sys.stdout)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flor", description="Hindsight logging for PyTorch: inspect recorded runs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("ls", help="list experiments, or the runs of one", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="an experiment: list its runs")
    p.set_defaults(func=cmd_ls)
    add_analysis_commands(sub)
    add_spool_commands(sub)
    add_replay_command(sub)
    return parser




def _sub(sub: Any, name: str, help: str, epilog: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog="examples:\n" + epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def add_analysis_commands(sub: Any) -> None:
    """logs, metrics, show, plot and compare."""
    p = _sub(sub, "logs", "print logged values: record and replay side by side with each run's hyperparameters", """\
  flor logs cnn-demo                          the latest run, one JSON object per value
  flor logs cnn-demo --format table           one row per epoch; hindsight columns marked *
  flor logs cnn-demo --run all --format csv > logs.csv
  flor logs cnn-demo --run all --wide --format csv --metric val_acc
""")
    _run_options(p)
    p.add_argument("--newest", action="store_true",
                   help="long layout: one value per run/name/epoch/step, the newest replay's over the recording's")
    p.set_defaults(func=cmd_logs)

    p = _sub(sub, "metrics", "extract metrics from printed output with regexes in SageMaker's {Name, Regex} form", """\
  flor metrics cnn-demo --definitions defs.json --format table
  flor metrics cnn-demo --run all --definitions '[{"Name": "val_loss", "Regex": "val_loss ([0-9.eE+-]+)"}]'
  flor metrics cnn-demo --definitions defs.json --format analytics     timestamp,metric_name,value,epoch,...
defs.json holds [{"Name": ..., "Regex": ...}, ...] (at most 40; group 1 is the number).
""")
    _run_options(p, analytics=True)
    p.add_argument("--definitions", required=True, metavar="JSON",
                   help="a JSON file, or inline JSON, of [{\"Name\": ..., \"Regex\": ...}]")
    p.add_argument("--newest", action="store_true", help="long layout: the newest replay's value per epoch")
    p.set_defaults(func=cmd_metrics)

    p = _sub(sub, "show", "summarize one run: configuration, status, epochs, checkpoints, storage, values", """\
  flor show cnn-demo                  the latest run
  flor show cnn-demo 20261130T0500    a run by id prefix
  flor show cnn-demo --json
""")
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("run", nargs="?", default=None, help="a run id or unique prefix; default: the latest")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.set_defaults(func=cmd_show)

    p = _sub(sub, "plot", "plot logged values against epoch or step into a PNG (several runs overlaid)", """\
  flor plot cnn-demo val_acc -o val_acc.png                  every run, epoch on the x-axis
  flor plot cnn-demo val_loss val_acc --runs 20261130T05 -o curves.png
  flor plot cnn-demo loss --x step -o loss.png               values logged with step=
A copy is kept in the newest plotted run's plots/ folder.
""")
    p.add_argument("name", help="the experiment")
    p.add_argument("metric", nargs="+", help="logged names, one panel each")
    p.add_argument("--x", choices=["epoch", "step"], default="epoch", help="the x-axis (default: epoch)")
    p.add_argument("--runs", nargs="+", default="all", metavar="RUN", help="run ids or prefixes (default: all)")
    p.add_argument("-o", "--output", type=Path, default=None, help="the PNG to write")
    p.add_argument("--definitions", default=None, metavar="JSON", help="also plot regex metrics (see flor metrics)")
    p.add_argument("--title", default=None)
    p.set_defaults(func=cmd_plot)

    p = _sub(sub, "compare", "compare runs grouped by hyperparameters: n, mean ± std, min, max, ranked", """\
  flor compare cnn-sweep --by lr --metric val_acc
  flor compare cnn-sweep --by lr --metric val_loss --at best --plot val_loss.png
  flor compare sweep-a sweep-b --by lr --by batch_size --metric val_acc --format csv
Each run counts with its final value (--at best: its best; --at 5: at epoch 5); std is the
sample standard deviation (n-1); groups are ranked by mean, best first.
""")
    p.add_argument("name", nargs="+", help="experiments whose runs to compare")
    p.add_argument("--by", action="append", required=True, metavar="HYPERPARAM",
                   help="group by this hyperparameter (repeatable)")
    p.add_argument("--metric", required=True, help="the logged name to compare")
    p.add_argument("--at", type=_epoch_or_word, default="final", help="final (default), best, or an epoch number")
    p.add_argument("--goal", choices=["min", "max"], default=None,
                   help="which way is better (default: min for names like loss/error, else max)")
    p.add_argument("--runs", nargs="+", default=None, metavar="RUN", help="only these run ids or prefixes")
    p.add_argument("--unfinished", action="store_true", help="also use runs that crashed or are running")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")
    p.add_argument("--plot", type=Path, default=None, metavar="PNG",
                   help="also plot each group's mean with a min-max band over its runs")
    p.add_argument("--x", choices=["epoch", "step"], default="epoch", help="the plot's x-axis")
    p.add_argument("--definitions", default=None, metavar="JSON", help="compare a regex metric (see flor metrics)")
    p.set_defaults(func=cmd_compare)


def _run_options(p: argparse.ArgumentParser, analytics: bool = False) -> None:
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("--run", default=None, help="a run id (or unique prefix), or 'all'; default: the latest")
    formats = ["jsonl", "csv", "table"] + (["analytics"] if analytics else [])
    p.add_argument("--format", choices=formats, default="jsonl",
                   help="jsonl/csv: one value a line (default jsonl); table: one row per epoch and step"
                        + ("; analytics: SageMaker TrainingJobAnalytics columns plus epoch" if analytics else ""))
    p.add_argument("--wide", action="store_true", help="csv/jsonl in the table's layout (newest replay wins)")
    p.add_argument("--metric", action="append", help="only this name (repeatable)")


# -- S3 spool ---------------------------------------------------------------------------


def _spool_url(given: str | None) -> str:
    from .settings import parse_s3_url

    url = given or SETTINGS.spool
    if not url:
        raise FlorError("no spool target: give one (flor spool NAME s3://BUCKET/PREFIX) or set FLOR_SPOOL")
    bucket, prefix = parse_s3_url(url)
    return f"s3://{bucket}/{prefix}".rstrip("/")


def cmd_spool(args: argparse.Namespace) -> int:
    from .store.spool import Spooler

    store = ExperimentStore(SETTINGS.home, validate_name(args.name))
    url = _spool_url(args.url)
    if not store.runs():
        raise FlorError(f"no experiment {args.name!r} under {SETTINGS.home}; `flor ls` lists them")
    runs = None if args.run in (None, "all") else [store.resolve_run(args.run)]
    spooler = Spooler(store, url, workers=args.workers)
    spooler.remote.check()
    try:
        spooler.spool(runs)
    finally:
        print(f"flor: {args.name}: {spooler.summary()}")
        spooler.close()
    if args.evict:
        kept = spooler.evict(runs)
        print(f"flor: evicted {spooler.counts.evicted} local blobs ({_size(spooler.counts.evicted_bytes)}) "
              f"verified in {url}" + (f"; kept {kept} that are not" if kept else ""))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .store.remote import RemoteBlobs, open_spool, pick_run, pull_run, spooled_runs

    store = ExperimentStore(SETTINGS.home, validate_name(args.name))
    url = _spool_url(args.spool)
    remote = open_spool(url, args.workers)
    runs = spooled_runs(remote, args.name)
    chosen = runs if args.run == "all" and runs else [pick_run(args.run, runs, args.name, f"in {url}")]
    fetcher = RemoteBlobs(store, remote, workers=args.workers)
    for run in chosen:
        files = pull_run(store, remote, run, blobs=not args.metadata_only, fetcher=fetcher, workers=args.workers)
        print(f"flor: pulled run {run} of {args.name} into {store.root}: {files} files")
    fetcher.close()
    print(f"flor: {fetcher.fetched} blobs fetched ({_size(fetcher.fetched_bytes)}), "
          f"{remote.stats.downloaded} objects verified, {remote.stats.retries} retries")
    return 0


def add_spool_commands(sub: Any) -> None:
    """spool and pull: the S3 spool (see docs/s3.md)."""
    p = _sub(sub, "spool", "upload an experiment's runs to S3, verified and resumable; optionally evict local blobs", """\
  flor spool cnn-demo s3://my-bucket/flor          every run; again after a crash: it resumes
  flor spool cnn-demo --run 20261130T05 --evict    one run (FLOR_SPOOL as target), then free local disk
""")
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("url", nargs="?", help="s3://BUCKET/PREFIX; default: FLOR_SPOOL")
    p.add_argument("--run", default=None, help="a run id (or unique prefix); default: every run")
    p.add_argument("--evict", action="store_true",
                   help="then delete local blobs whose upload is verified (manifests and logs stay)")
    p.add_argument("--workers", type=int, default=8, help="parallel uploads (default 8)")
    p.set_defaults(func=cmd_spool)
    p = _sub(sub, "pull", "fetch a spooled run from S3: metadata, logs and every checkpoint blob", """\
  flor pull cnn-demo                              the latest run in FLOR_SPOOL
  flor pull cnn-demo 20261130T05 --spool s3://my-bucket/flor
  flor pull cnn-demo all --metadata-only          every run, without blobs (replay fetches them)
""")
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("run", nargs="?", default=None, help="a run id (or unique prefix), or 'all'; default: the latest")
    p.add_argument("--spool", default=None, help="s3://BUCKET/PREFIX; default: FLOR_SPOOL")
    p.add_argument("--metadata-only", action="store_true", help="skip the blobs (a replay fetches what it needs)")
    p.add_argument("--workers", type=int, default=8, help="parallel downloads (default 8)")
    p.set_defaults(func=cmd_pull)


# -- parallel replay (docs/parallel.md) --------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    from .estimate import estimate_replay
    from .launch import _script_of, detect_gpus, run_launch
    from .report import print_plan, replay_report
    from .plan import select
    from .settings import parse_epoch_range

    store = ExperimentStore(SETTINGS.home, validate_name(args.name))
    run = store.resolve_run(args.run)
    if args.report is not None:
        rep = replay_report(store, run, None if args.report == "latest" else args.report)
        print(json.dumps({k: v for k, v in rep.items() if k != "text"}, indent=1, default=str) if args.json
              else rep["text"])
        return 0 if not rep["missing"] else 1
    if args.workers is not None and args.workers < 1:
        raise FlorError(f"--workers {args.workers}: give at least 1")
    gpus = detect_gpus(args.gpus)
    epoch_range = parse_epoch_range(args.epochs, "--epochs") if args.epochs else None
    command = list(args.cmd or [])
    args.threads = _replay_threads(args, store, run, gpus, epoch_range, command)
    if args.plan:
        meta = store.read_run(run)
        n_epochs = int(meta.get("epochs_planned") or meta.get("epochs_done") or 0)
        within = select(n_epochs, epoch_range) if epoch_range else None
        kw = dict(script=_script_of(command), within=within, strong=args.strong, threads=args.threads, gpus=gpus)
        workers = args.workers or (len(gpus) if gpus else estimate_replay(store, run, meta, workers=1, **kw).fastest[0])
        est = estimate_replay(store, run, meta, workers=workers, **kw)
        if args.json:
            print(json.dumps({"run": run, "workers": workers, "estimate_s": round(est.total_s, 3),
                              "seconds": [round(x, 3) for x in est.seconds], "startup_s": round(est.startup_s, 3),
                              "startup_from": est.startup_from, "fastest": list(est.fastest),
                              "by_count": est.by_count, "probed": sorted(est.probed) if est.probed is not True else True,
                              "segments": [[p.segment.start, p.segment.stop] for p in est.plans],
                              "init": [[p.init.start, p.init.stop] for p in est.plans]}, indent=1))
        else:
            print_plan(est, name=args.name, run=run, meta=meta, gpus=gpus, within=within, out=sys.stdout)
            if not command:
                print("  (no command given: blocks counted as not probed; add -- python SCRIPT.py ARGS to check)")
        return 0
    return run_launch(store, run, command, workers=args.workers, gpus=gpus, epoch_range=epoch_range,
                      strong=args.strong, threads=args.threads, fresh=args.fresh, ray=args.ray)


def _replay_threads(args: argparse.Namespace, store: ExperimentStore, run: str, gpus: list[str],
                    epoch_range: tuple[int, int | None] | None, command: list[str]) -> int | None:
    """``--threads``: a number, or ``auto`` (the cores divided among the workers)."""
    from .estimate import cores, estimate_replay
    from .launch import _script_of
    from .plan import select

    if args.threads is None:
        return None
    if args.threads != "auto":
        if not args.threads.isdigit() or int(args.threads) < 1:
            raise FlorError(f"--threads {args.threads!r}: give a number of threads like 2, or auto")
        return int(args.threads)
    workers = args.workers or len(gpus)
    if not workers:  # the fastest count with one thread a worker
        meta = store.read_run(run)
        n = int(meta.get("epochs_planned") or meta.get("epochs_done") or 0)
        workers = estimate_replay(store, run, meta, workers=1, script=_script_of(command), threads=1, gpus=gpus,
                                  within=select(n, epoch_range) if epoch_range else None).fastest[0]
        args.workers = workers
    return max(1, cores() // workers)


def add_replay_command(sub: Any) -> None:
    """replay: parallel replay on this machine, its plan, and merged reports."""
    p = _sub(sub, "replay", "replay a recorded run with several workers on this machine, and merge their results", """\
  flor replay cnn-demo -- python train.py --epochs 8          workers: one a GPU, or the fastest count on CPU
  flor replay cnn-demo --workers 2 -- python train.py --epochs 8
  flor replay cnn-demo --gpus 0,1,2,3 --epochs 40:61 -- python train.py   epochs 40 to 60 only
  flor replay cnn-demo --plan --workers 8 -- python train.py  segments and estimated time; runs nothing
  flor replay cnn-demo --report                               merged summary of the newest replay (torchrun, Slurm...)
  flor replay cnn-demo --ray --workers 8 -- python train.py   one Ray task a segment
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
    p.add_argument("--threads", default=None, metavar="N|auto",
                   help="torch threads per worker instead of the recorded count (not bit-exact); "
                        "auto: this machine's cores divided among the workers")
    p.add_argument("--run", default=None, help="a run id or unique prefix; default: the latest")
    p.add_argument("--fresh", action="store_true", help="start a new replay instead of resuming an unfinished one")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the workers as Ray tasks, one a segment (num_gpus=1 each on a GPU cluster); "
                        "ADDRESS or RAY_ADDRESS joins a cluster, else a local Ray starts (pip install 'flor[ray]')")
    p.add_argument("--plan", action="store_true", help="print the segments and estimated times, and run nothing")
    p.add_argument("--report", nargs="?", const="latest", default=None, metavar="REPLAY_ID",
                   help="print the merged summary of a replay (default: the newest), however it was launched")
    p.add_argument("--json", action="store_true", help="--plan and --report as JSON")
    p.set_defaults(func=cmd_replay, cmd=[])


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if argv[:1] == ["replay"] and "--" in argv:  # the training command after -- is not flor's to parse
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if command:
        args.cmd = command
    try:
        return int(args.func(args) or 0)
    except FlorError as exc:
        print(f"flor: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
