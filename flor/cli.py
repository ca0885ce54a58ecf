"""The ``flor`` command: one function per subcommand. Errors exit 2 with one line."""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Sequence

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


def cmd_logs(args: argparse.Namespace) -> int:
    from .analysis import records

    rows = records(args.name, run=args.run, newest=args.newest)
    if args.metric:
        rows = [r for r in rows if r["name"] in args.metric]
    out = sys.stdout
    if args.format == "jsonl":
        for r in rows:
            out.write(json.dumps({k: r.get(k) for k in FIELDS}) + "\n")
    else:
        writer = csv.DictWriter(out, fieldnames=FIELDS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in FIELDS})
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
    p = sub.add_parser("logs", help="print logged values, one record a line", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("--run", default=None, help="a run id (or unique prefix), or 'all'; default: the latest")
    p.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    p.add_argument("--metric", action="append", help="only this name (repeatable)")
    p.add_argument("--newest", action="store_true",
                   help="one value per run/name/epoch/step: the newest replay's, else the recording's")
    p.set_defaults(func=cmd_logs)
    return parser




def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except FlorError as exc:
        print(f"flor: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
