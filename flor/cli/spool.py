"""``flor`` subcommands: spool and pull: the S3 spool."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import FlorError
from ..settings import SETTINGS, validate_name
from ..store import ExperimentStore

from .common import human_size, subcommand


def _spool_url(given: str | None) -> str:
    from ..settings import parse_s3_url

    url = given or SETTINGS.spool
    if not url:
        raise FlorError("no spool target: give one (flor spool NAME s3://BUCKET/PREFIX) or set FLOR_SPOOL")
    bucket, prefix = parse_s3_url(url)
    return f"s3://{bucket}/{prefix}".rstrip("/")


def cmd_spool(args: argparse.Namespace) -> int:
    from ..store.sync import Spooler

    store = ExperimentStore(SETTINGS.home, validate_name(args.name))
    url = _spool_url(args.url)
    if not store.runs():
        raise FlorError(f"no experiment {args.name!r} under {SETTINGS.home}; `flor ls` lists them")
    runs = None if args.run in (None, "all") else [store.resolve_run(args.run)]
    spooler = Spooler(store, url, workers=args.workers)
    spooler.remote.check()
    from ..store.trust import remember_spool  # the user's own: a replay may fetch evicted blobs from it

    remember_spool(SETTINGS.config_dir, url)
    try:
        spooler.spool(runs)
    finally:
        print(f"flor: {args.name}: {spooler.summary()}")
        spooler.close()
    if args.evict:
        kept = spooler.evict(runs)
        print(f"flor: evicted {spooler.counts.evicted} local blobs ({human_size(spooler.counts.evicted_bytes)}) "
              f"verified in {url}" + (f"; kept {kept} that are not" if kept else ""))
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .._fmt import progress
    from ..store.experiment import pick_run
    from ..store.sync import RemoteBlobs, open_spool, pull_run, spooled_runs

    store = ExperimentStore(SETTINGS.home, validate_name(args.name))
    url = _spool_url(args.spool)
    remote = open_spool(url, args.workers)
    runs = spooled_runs(remote, args.name)
    chosen = runs if args.run == "all" and runs else [pick_run(args.run, runs, args.name, f"in {url}")]
    fetcher = RemoteBlobs(store, remote, workers=args.workers, progress=progress)
    for run in chosen:
        files = pull_run(store, remote, run, blobs=not args.metadata_only, fetcher=fetcher, workers=args.workers,
                         progress=progress)
        print(f"flor: pulled run {run} of {args.name} into {store.root}: {files} files")
    fetcher.close()
    print(f"flor: {fetcher.fetched} blobs fetched ({human_size(fetcher.fetched_bytes)}), "
          f"{remote.stats.downloaded} objects verified, {remote.stats.retries} retries")
    return 0


def add_spool_commands(sub: Any) -> None:
    """spool and pull: the S3 spool (see docs/s3.md)."""
    p = subcommand(sub, "spool",
                   "upload an experiment's runs to S3, verified and resumable; optionally evict local blobs", """\
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
    p = subcommand(sub, "pull", "fetch a spooled run from S3: metadata, logs and every checkpoint blob", """\
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
