"""``flor export``: a run's values, recorded and hindsight, into MLflow, W&B or TensorBoard."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from ..settings import SETTINGS
from .common import subcommand

__all__ = ["add_export_command", "cmd_export"]


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import export_run, parse_targets
    from ..store.experiment import open_experiment

    if args.all and args.run is not None:
        raise ConfigError("--run and --all both name the runs to export; give one")
    targets = parse_targets(args.to)
    store = open_experiment(args.name, SETTINGS.home)
    options = {"tracking_uri": args.tracking_uri, "logdir": args.logdir, "mode": args.wandb_mode}
    for run in store.select_runs("all" if args.all else args.run):
        for target in targets:
            result = export_run(store, run, target, dry_run=args.dry_run, prefix=args.prefix, options=options,
                                trust=args.trust)
            print(result.line())
            if args.dry_run:
                for p in result.written:
                    print(f"  {p.key} step={p.step} value={p.value!r}" + (" (hindsight)" if p.hindsight else ""))
    return 0


def add_export_command(sub: Any) -> None:
    p = subcommand(sub, "export", "write a run's values, recorded and hindsight, into MLflow, W&B or TensorBoard", """\
  flor export cnn-demo --to mlflow               into the MLflow run the recording reported to
  flor export cnn-demo --to mlflow --dry-run     print what would be written
  flor export cnn-demo --to tensorboard --all    every run, a new event file in each script's logdir
  flor export cnn-demo --to wandb --run 2026     resume the recorded W&B run (offline unless WANDB_MODE says)
Exporting twice adds nothing: values already there at the same (key, step) are not written again.
""")
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("--to", required=True, help="mlflow, wandb or tensorboard (several joined by commas)")
    p.add_argument("--run", default=None, help="a run id (or unique prefix); default: the latest run")
    p.add_argument("--all", action="store_true", help="every run of the experiment")
    p.add_argument("--dry-run", action="store_true", help="print what would be written, write nothing")
    p.add_argument("--prefix", default="", help="put before every key, e.g. flor/ (default: none)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow: the tracking URI (default: the recorded one, else MLFLOW_TRACKING_URI)")
    p.add_argument("--logdir", default=None,
                   help="TensorBoard: the folder (default: the script's SummaryWriter logdir, as recorded)")
    p.add_argument("--trust", action="store_true",
                   help="write into the destination run.json names even though no key you trust signed it "
                        "(check it first with flor show)")
    p.add_argument("--wandb-mode", default=None, choices=("offline", "online"),
                   help="W&B: offline (the default, unless WANDB_MODE says) or online")
    p.set_defaults(func=cmd_export)
