"""The ``flor`` command: one function per subcommand. Errors exit 2 with one line.

Subcommands live by topic: ``analysis`` (logs, metrics, show, plot, compare), ``spool``
(spool, pull) and ``replay``; this module has ``ls``, the parser and ``main``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

from .._version import __version__
from ..errors import FlorError, warn
from ..settings import SETTINGS, validate_name
from ..store import ExperimentStore
from .analysis import add_analysis_commands
from .common import InertStream, human_size
from .export import add_export_command
from .replay import add_replay_command
from .spool import add_spool_commands
from .verify import add_verify_command

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
  flor export cnn-demo --to mlflow            recorded and hindsight values into the run's MLflow run
Every command takes --help.
"""




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
            print(f"{name:<24} {len(runs):>4}  {runs[-1] if runs else '-':<30} {human_size(store.disk_usage()):>9}")
        return 0
    store = ExperimentStore(home, validate_name(args.name))
    runs = store.runs()
    if not runs:
        raise FlorError(store.no_runs())
    print(f"{'run':<30} {'status':<22} {'started (UTC)':<19} {'epochs':>6} {'ckpts':>5} {'ckpt size':>10}")
    for run in runs:
        try:
            meta = store.read_run(run)
        except FlorError as exc:  # listed as damaged; the others are still worth listing
            warn("FL402", f"skipped {exc}")
            print(f"{run:<30} {'damaged':<22} {'-':<19} {'-':>6} {'-':>5} {'-':>10}")
            continue
        manifests = list(store.manifests(run))
        size = 0
        for block, epoch, occ in manifests:
            try:
                size += int(store.read_manifest(run, block, epoch, occ).get("new_bytes", 0))
            except FlorError as exc:  # listed, not summed: `flor verify` says what is wrong
                warn("FL402", f"run {run}: {exc}")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(meta.started or 0))
        print(f"{run:<30} {meta.status_text():<22} {started:<19} {meta.epochs_done:>6} "
              f"{len(manifests):>5} {human_size(size):>10}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flor",
        description="Hindsight logging for PyTorch: list, read, plot, compare, spool and replay recorded runs.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"flor {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("ls", help="list experiments, or the runs of one", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="an experiment: list its runs")
    p.set_defaults(func=cmd_ls)
    add_analysis_commands(sub)
    add_spool_commands(sub)
    add_replay_command(sub)
    add_verify_command(sub)
    add_export_command(sub)
    return parser


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
    streams = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, InertStream):  # what a store says is printed, never obeyed by the terminal
        sys.stdout = InertStream(sys.stdout)
        sys.stderr = InertStream(sys.stderr, keep_cr=True)  # progress bars redraw with a leading CR
    try:
        return _run(args)
    finally:
        sys.stdout, sys.stderr = streams


def _run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.showwarning = _one_line
        try:
            return int(args.func(args) or 0)
        except FlorError as exc:
            print(f"flor: error: {exc}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            return 0
        except KeyboardInterrupt:  # Ctrl-C (or, in flor replay, SIGTERM) before a launch could catch it
            print("\nflor: interrupted", file=sys.stderr)
            return 130


def _one_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
              file: Any = None, line: str | None = None) -> None:
    """flor's own warnings as the one line they are (``flor: skipped run ...``), not Python's
    two (file, line number, source); any other warning as Python shows it."""
    text = str(message)
    if not text.startswith("flor: "):
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n")
    print(text, file=file or sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

