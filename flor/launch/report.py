"""One view of a replay's many workers: the merged verification summary, the report of any
replay of a run (placed by ``flor replay``, torchrun, Slurm or Ray: only the files are read),
and the ``flor replay --plan`` printout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Collection, TextIO

from .._fmt import span
from ..errors import FlorError
from ..placement import cores
from ..store import ExperimentStore
from ..store.layout import RunLayout
from ..store.runmeta import RunMeta
from ..verify import BlockEvent, Summary, never_ran
from .estimate import ReplayEstimate
from .records import read_launch_record, read_summary

__all__ = ["merged_summary", "print_plan", "replay_report"]


def merged_summary(run_dir: Path, replay_id: str, workers: int | None = None, *,
                   failures: dict[int, str] | None = None, header: str | None = None,
                   shown: Collection[str] = ()) -> dict[str, Any]:
    """One verification report for all workers of a replay, from their ``*.summary.json``;
    notes in ``shown`` (already printed while the workers ran) are not repeated in its text.

    Workers without a summary (not run yet, killed) are listed as missing. Works for replays
    placed by ``flor replay``, torchrun, Slurm or Ray alike: only the files are read.
    """
    found: dict[int, dict] = {}
    for _, worker, path in RunLayout(run_dir).replay_summaries(replay_id):
        s = read_summary(path)  # None for a file of another shape (one warning): the worker counts as missing
        if s is not None:
            found[worker] = s
    n = workers or max([int(s.get("ngpus") or 1) for s in found.values()] or [0])
    failures = dict(failures or {})
    merged = Summary(header=header or f"flor: replay {replay_id}: {n} workers")
    lines: list[str] = []
    notes: list[str] = []
    rewrote: dict[str, list[int]] = {}  # a file the recording wrote -> the workers that wrote it again (FL340)
    new_logs: dict[str, str] = {}  # the hindsight flor.log calls the edit added: where -> name (FL338)
    ran_new: set[str] = set()  # ... those that ran in some worker
    whole = True  # every worker told which of them ran in its segment (a launch of every epoch)
    for w in range(n):
        s = found.get(w)
        if s is None:
            failures.setdefault(w, f"worker {w} has no summary: it has not run, or was killed")
            lines.append(f"  worker {w}: missing")
            continue
        if s.get("exit") is not None:
            failures.setdefault(w, f"worker {w} failed ({s['exit']})")
        seg, init = s.get("segment"), s.get("init")
        c = s.get("counts") or {}
        lines.append(f"  worker {w}: epochs {span(range(*seg)) if seg else 'none'} (initialization "
                     f"{span(range(*init)) if init else 'none'}): {s.get('verdict')}, {c.get('restored', 0)} restored, "
                     f"{c.get('matched', 0) + c.get('diverged', 0)} checked, {c.get('executed', 0)} re-executed")
        merged.events.extend(BlockEvent(**b) for b in s.get("blocks") or [])
        merged.shared_logs += int(s.get("shared_logs") or 0)
        merged.log_mismatches.extend(s.get("log_mismatches") or [])
        merged.hindsight = sorted(set(merged.hindsight) | set(s.get("hindsight") or []))
        merged.loop.extend(x for x in s.get("loop") or [] if x not in merged.loop)  # the loop stopped elsewhere
        merged.unrestored = sorted(set(merged.unrestored) | {str(x) for x in s.get("unrestored") or []})
        merged.outside = merged.outside or [str(x) for x in s.get("outside") or []]
        merged.lenient = merged.lenient or bool(s.get("lenient"))  # its last line: exit status 3, or 0 lenient
        notes.extend(x for x in s.get("notes") or [] if x not in notes)
        for path in s.get("rewrote") or []:
            if isinstance(path, str) and w not in rewrote.setdefault(path, []):
                rewrote[path].append(w)
        whole = whole and s.get("exit") is None and s.get("new_logs") is not None
        new_logs.update((where, name) for name, where in s.get("new_logs") or [])
        ran_new.update(s.get("ran_new") or [])
    raced = {path: ws for path, ws in rewrote.items() if len(ws) > 1}
    notes.extend(f"FL341 workers {', '.join(map(str, ws))} of this replay each wrote {path}, which the recording "
                 "wrote too: it holds what the last of them to write it left, not the recording's; guard the write "
                 "with `if not flor.replaying():`" for path, ws in sorted(raced.items()))
    if whole and not failures and n > 1:  # each worker ran its segment: a new log none of them ran never ran
        notes.extend(f"FL338 {never_ran(where, 'in any worker of this replay')}"
                     for where, name in sorted(new_logs.items()) if name not in ran_new)
    merged.notes = notes
    if failures:
        merged.failed = f"{len(failures)} of {n} workers did not finish"
    text = merged.render(shown=shown).split("\n")
    body = [text[0], *lines, *text[1:-1]]
    body.extend(f"  {f}" for f in failures.values())
    verdict_line = text[-1]
    if failures:
        verdict_line += "; run the same `flor replay` command again to replay only the missing segments"
    body.append(verdict_line)
    out = merged.to_json()
    out.pop("blocks")
    return {**out, "replay": replay_id, "workers": n, "missing": sorted(failures), "raced": raced,
            "exit_status": merged.exit_status, "text": "\n".join(body)}


def print_plan(est: ReplayEstimate, *, name: str, run: str, meta: RunMeta, gpus: list[str], within: range | None,
               out: TextIO) -> None:
    """``flor replay --plan``: the segments, initialization epochs and estimated times."""
    n_epochs = meta.epochs
    probed = "all" if est.probed is True else (", ".join(sorted(est.probed)) or "none")
    ran = f" ({meta.epochs_text()})" if meta.stopped_early or meta.status == "running" else ""
    out.write(f"flor replay --plan: {name} run {run}: {n_epochs} epochs recorded{ran}"
              + (f", replaying {span(within)}" if within is not None else "") + f"; blocks probed: {probed}\n")
    where = f"{len(gpus)} GPU(s) ({','.join(gpus)})" if gpus else \
        f"{cores()} CPU cores (load {est.busy:.1f} from other processes), {est.threads} torch thread(s) a worker"
    out.write(f"  on this machine: {where}; worker startup {est.startup_s:.1f} s ({est.startup_from})\n")
    out.write(f"  {est.workers} worker(s):\n")
    for p, secs in zip(est.plans, est.seconds):
        out.write(f"    worker {p.pid}: epochs {span(p.segment):<9} initialization epochs {span(p.init):<9} "
                  f"estimated {secs:7.1f} s\n")
    why = [f"workers slowed {est.slowdown:.1f}x by sharing"] if est.slowdown > 1 else []
    why += [f"the launcher's own {est.launcher_s:.1f} s before them"] if est.launcher_s else []
    out.write(f"  estimated time: {est.total_s:.1f} s" + (f" ({'; '.join(why)})" if why else "") + "\n")
    # each count with the launcher's own time, as the estimated time above
    counts = ", ".join(f"{n}: {t + est.launcher_s:.1f} s" for n, t in est.by_count.items())
    out.write(f"  fastest: {est.fastest[0]} worker(s), estimated {est.fastest[1] + est.launcher_s:.1f} s  "
              f"(by worker count: {counts})\n")


def replay_report(store: ExperimentStore, run: str, replay_id: str | None) -> dict[str, Any]:
    """The merged summary of one replay of ``run`` (default: the newest), however it was placed."""
    layout = store.layout(run)
    summaries = sorted(layout.replay_summaries(), key=lambda x: x[2].stat().st_mtime)
    ids = list(dict.fromkeys(replay for replay, _, _ in summaries))
    if replay_id is None:
        if not ids:
            raise FlorError(f"run {run} of {store.name} has no replay yet; start one with `flor replay {store.name} -- "
                            f"python SCRIPT.py ARGS`")
        replay_id = ids[-1]
    elif replay_id not in ids:
        raise FlorError(f"run {run} has no replay {replay_id!r}; its replays: {', '.join(ids) or 'none'}")
    workers = None
    record = layout.launch_record(replay_id)
    rec = read_launch_record(record) if os.path.lexists(record) else None
    if rec is not None:  # a launch record of another shape is skipped: the workers come from the summaries
        workers = rec.get("workers") or None
    return merged_summary(store.run_path(run), replay_id, workers)
