"""``flor verify``: check an experiment's run.json files, manifests and blobs; repair what can be."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import FlorError
from ..findings import line as finding
from ..settings import SETTINGS, validate_name
from ..store import ExperimentStore
from .common import human_size, subcommand

__all__ = ["add_verify_command", "cmd_verify"]


def cmd_verify(args: argparse.Namespace) -> int:
    """0 when everything checked is sound, 1 when not; unknown names are FlorErrors (exit 2)."""
    store = ExperimentStore(SETTINGS.home, validate_name(args.name))
    if not store.root.is_dir():
        raise FlorError(f"no experiment {args.name!r} under {SETTINGS.home}; `flor ls` lists them")
    runs = None if args.run in (None, "all") else [store.resolve_run(args.run)]
    if args.dry_run and not args.repair:
        raise FlorError("--dry-run goes with --repair: flor verify NAME --repair --dry-run")
    if args.grace is not None and not (args.grace >= 0 and args.grace < 1e12):
        raise FlorError(f"--grace {args.grace}: give the seconds an unreferenced blob is kept, like 3600 (or 0)")
    held = None
    if args.repair and not args.dry_run:
        from ..store.lock import exclusive

        held = exclusive(store.root)  # no recording starts while the store is checked and repaired
        if held is None:
            print(finding("FL418", f"repair refused: a recording of {args.name} holds the store's lock (or the store "
                                "cannot be locked); repair when no recording runs"))
            return 1
    try:
        return _verify(args, store, runs)
    finally:
        from ..store.lock import release

        release(held)


def _verify(args: argparse.Namespace, store: ExperimentStore, runs: list[str] | None) -> int:
    from ..store.check import check_experiment
    from ..store.repair import GRACE_S, repair

    report = check_experiment(store, runs)
    for line in report.problems:
        print(f"problem: {line}")
    what = f"run {runs[0]}" if runs else f"{report.runs} run(s)"
    evicted = f", {report.evicted} named blob(s) not local (in the spool)" if report.evicted else ""
    print(f"flor: verified {args.name}: {what}, {report.manifests} manifest(s), {report.blobs} blob(s) "
          f"({human_size(report.blob_bytes)}){evicted}: "
          + (f"{len(report.problems)} problem(s)" if report.problems else "no problems"))
    if args.repair:
        for line in repair(store, report, dry_run=args.dry_run, grace=GRACE_S if args.grace is None else args.grace):
            print(line if line.startswith("flor: ") else f"flor: {line}")
        if report.unreadable:
            return 1
        if not report.tmp_files and not report.orphans and not report.dead_starts:
            print("flor: nothing to repair")
    elif report.tmp_files or report.orphans or report.dead_starts:
        starts = (f", {len(report.dead_starts)} run folder(s) of recordings killed before they wrote run.json"
                  if report.dead_starts else "")
        print(f"flor: {len(report.tmp_files)} leftover temp file(s){starts} and {len(report.orphans)} unreferenced "
              f"blob(s): `flor verify {args.name} --repair` removes them (--dry-run first to see the list)")
    if report.tmp_in_progress:
        print(f"flor: {report.tmp_in_progress} temp file(s) of writers still running were left alone")
    return 0 if report.ok else 1


def add_verify_command(sub: Any) -> None:
    p = subcommand(sub, "verify",
                   "check every run.json, manifest and blob of an experiment (hash, size, references)", """\
  flor verify cnn-demo                        exit 0 when sound, 1 with one line per problem
  flor verify cnn-demo --run 20261130T05      one run: its run.json, manifests and the blobs they name
  flor verify cnn-demo --repair --dry-run     list leftover temp files and unreferenced blobs
  flor verify cnn-demo --repair               remove them (only inside objects/ for blobs)
""")
    p.add_argument("name", help="the experiment (the NAME given to --flor)")
    p.add_argument("--run", default=None, help="a run id (or unique prefix); default: every run")
    p.add_argument("--repair", action="store_true",
                   help="remove leftover temp files and blobs no manifest names (not with --run)")
    p.add_argument("--dry-run", action="store_true", help="with --repair: print what would be removed")
    p.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                   help="with --repair: keep unreferenced blobs younger than this (default 3600: a recording may "
                        "be writing them)")
    p.set_defaults(func=cmd_verify)
