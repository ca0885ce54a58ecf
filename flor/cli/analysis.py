"""``flor`` subcommands: logs, metrics, show, plot and compare."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import FlorError
from ..logs import FIELDS
from ..settings import SETTINGS

from .common import subcommand


def _hparams(name: str, runs: list[str]) -> dict[str, dict]:
    from ..analysis.frame import hyperparameters
    from ..store.experiment import open_experiment

    store = open_experiment(name, SETTINGS.home)
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
    from ..analysis.frame import mark_hindsight, wide
    from ..analysis.output import write_rows
    from ..logs import merge_newest

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
        write_rows(sys.stdout, columns, table, args.format, marked=hindsight, legend=_LEGEND, raw=args.raw)
        return
    if args.newest:
        rows = mark_hindsight(merge_newest(rows), rows)
    names = list(dict.fromkeys(k for h in hp.values() for k in h))
    for r in rows:
        r["hparams"] = hp.get(r["run"], {})
        for k in names:
            r[f"hp.{k}"] = r["hparams"].get(k)
    from ..analysis.output import write_rows

    if args.format == "jsonl":
        write_rows(sys.stdout, [*fields, "hparams"], rows, "jsonl")
    else:
        write_rows(sys.stdout, [*fields, *(f"hp.{k}" for k in names)], rows, "csv", raw=args.raw)


def cmd_logs(args: argparse.Namespace) -> int:
    from ..analysis import records

    rows = records(args.name, run=args.run, home=SETTINGS.home)
    rows = _check_metrics(rows, args.metric, f"names {args.name} logged")
    _emit(args, rows, [*FIELDS, "script"])  # script: sha256[:12] of the script version that logged the value
    return 0


def cmd_metrics(args: argparse.Namespace) -> int:
    from ..store.experiment import open_experiment
    from ..analysis.metrics import analytics, extract, load_definitions
    from ..analysis.output import write_rows

    defs = load_definitions(args.definitions)
    store = open_experiment(args.name, SETTINGS.home)
    rows: list[dict] = []
    for run in store.select_runs(args.run):
        rows.extend(extract(store.run_path(run), run, defs))
    rows = _check_metrics(rows, args.metric, "metrics the definitions found in the printed output")
    if args.format == "analytics":
        cols = ["timestamp", "metric_name", "value", "epoch", "run", "source", "replay"]
        write_rows(sys.stdout, cols, analytics(rows), "csv", raw=args.raw)
        return 0
    _emit(args, rows, [*FIELDS, "timestamp"])
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..analysis.show import render_report, run_report

    rep = run_report(args.name, args.run, home=SETTINGS.home)
    if args.json:
        print(json.dumps({**rep, "meta": rep["meta"].to_json()}, indent=1, default=str))
    else:
        print(render_report(rep))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from ..analysis import plot_metrics
    from ..analysis.plots import check_output

    out = check_output(args.output, "-o")  # before any work: a bad path leaves nothing behind
    paths = plot_metrics(args.name, args.metric, runs=args.runs, x=args.x, out=out,
                         home=SETTINGS.home, definitions=args.definitions, title=args.title)
    _spool_plot(paths[-1])
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


def _spool_plot(kept: Path) -> None:
    """Upload a plot's copy in its run's ``plots/`` folder when a spool target is set, so it
    travels with the spooled run (warns, never raises: the plot is written either way)."""
    if not SETTINGS.spool:
        return
    if not kept.resolve().is_relative_to(SETTINGS.home.resolve()):
        return  # no copy could be kept in the store (a warning said so): nothing to upload
    kept = kept.resolve().relative_to(SETTINGS.home.resolve())
    from ..store import ExperimentStore
    from ..store.sync import spool_files

    name, *key = kept.parts  # home/<name>/runs/<run>/plots/<file>
    spool_files(ExperimentStore(SETTINGS.home, name), SETTINGS.spool, ["/".join(key)])


def _epoch_or_word(text: str) -> str | int:
    if text in ("final", "best"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use final, best or an epoch number") from None


def cmd_compare(args: argparse.Namespace) -> int:
    from ..analysis import compare, plot_comparison
    from ..analysis.compare import render, table_rows
    from ..analysis.output import write_rows
    from ..analysis.plots import check_output

    plot = check_output(args.plot, "--plot") if args.plot is not None else None  # before any work
    c = compare(args.name, by=args.by, metric=args.metric, at=args.at, goal=args.goal, runs=args.runs,
                x=args.x, home=SETTINGS.home, definitions=args.definitions, unfinished=args.unfinished)
    if args.format == "table":
        print(render(c))
    elif args.format == "json":
        print(json.dumps({"metric": c.metric, "by": c.by, "at": c.at, "goal": c.goal,
                          "groups": table_rows(c), "excluded": c.excluded}, indent=1))
    else:
        rows = table_rows(c)
        write_rows(sys.stdout, list(rows[0]) if rows else ["rank", *c.by], rows, "csv", raw=args.raw)
    if args.plot is not None:
        paths = plot_comparison(c, out=plot, home=SETTINGS.home)
        _spool_plot(paths[-1])
        for p in paths:
            print(f"wrote {p}", file=sys.stderr if args.format != "table" else sys.stdout)
    return 0


def add_analysis_commands(sub: Any) -> None:
    """logs, metrics, show, plot and compare."""
    p = subcommand(sub, "logs",
                   "print logged values: record and replay side by side with each run's hyperparameters", """\
  flor logs cnn-demo                          the latest run, one JSON object per value
  flor logs cnn-demo --format table           one row per epoch; hindsight columns marked *
  flor logs cnn-demo --run all --format csv > logs.csv
  flor logs cnn-demo --run all --wide --format csv --metric val_acc
""")
    _run_options(p)
    p.add_argument("--newest", action="store_true",
                   help="long layout: one value per run/name/epoch/step, the newest replay's over the recording's")
    p.set_defaults(func=cmd_logs)

    p = subcommand(sub, "metrics",
                   "extract metrics from printed output with regexes in SageMaker's {Name, Regex} form", """\
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

    p = subcommand(sub, "show", "summarize one run: configuration, status, epochs, checkpoints, storage, values", """\
  flor show cnn-demo                  the latest run
  flor show cnn-demo 20261130T0500    a run by id prefix
  flor show cnn-demo --json
""")
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("run", nargs="?", default=None, help="a run id or unique prefix; default: the latest")
    p.add_argument("--json", action="store_true", help="print everything as JSON")
    p.set_defaults(func=cmd_show)

    p = subcommand(sub, "plot",
                   "plot logged values against epoch or step into a PNG, SVG or PDF (several runs overlaid)", """\
  flor plot cnn-demo val_acc -o val_acc.png                  every run, epoch on the x-axis
  flor plot cnn-demo val_loss val_acc --runs 20261130T05 -o curves.png
  flor plot cnn-demo loss --x step -o loss.png               values logged with step=
A copy is kept in the newest plotted run's plots/ folder.
""")
    p.add_argument("name", help="the experiment")
    p.add_argument("metric", nargs="+", help="logged names, one panel each")
    p.add_argument("--x", choices=["epoch", "step"], default="epoch", help="the x-axis (default: epoch)")
    p.add_argument("--runs", nargs="+", default="all", metavar="RUN", help="run ids or prefixes (default: all)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="the file to write: .png, .svg or .pdf (the suffix names the format)")
    p.add_argument("--definitions", default=None, metavar="JSON", help="also plot regex metrics (see flor metrics)")
    p.add_argument("--title", default=None)
    p.set_defaults(func=cmd_plot)

    p = subcommand(sub, "compare", "compare runs grouped by hyperparameters: n, mean ± std, min, max, ranked", """\
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
    p.add_argument("--raw", action="store_true",
                   help="csv: cells as recorded, also those a spreadsheet would run as a formula (= + - @); by "
                        "default such a cell starts with '")
    p.add_argument("--plot", default=None, metavar="FILE",
                   help="also plot each group's mean with a min-max band over its runs "
                        "into FILE (.png, .svg or .pdf)")
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
    p.add_argument("--raw", action="store_true",
                   help="csv: cells as recorded, also those a spreadsheet would run as a formula (= + - @); by "
                        "default such a cell starts with '")
    p.add_argument("--metric", action="append", help="only this name (repeatable)")
