"""``flor replay NAME --all -- python train.py``: hindsight for a whole sweep.

Every selected run is replayed with its own recorded arguments (``run.json`` argv) through one
pool of workers: one :class:`~flor.launch.launcher.Launch` per run, its segments queued with
every other run's, at most ``--workers`` processes at a time, one progress bar, and one table
at the end (run, hyperparameters, script version, verdict, last hindsight values).

Script versions. A run whose recorded source (``runs/<run>/source/<script>``) differs from
today's script by only logging replays today's script. A run recorded with an older version
replays *its own* source with today's added logging moved in (:mod:`flor.source.transplant`);
that script is kept in ``runs/<run>/transplants/<sha12>/<script>`` and runs from the user's
working directory with today's script directory first on ``PYTHONPATH``, so the script's
sibling modules still import (its ``__file__`` is the kept copy: a script that reads files
beside itself by ``__file__`` should use the working directory instead). A run whose logging
cannot be placed, or whose recorded arguments hold a redacted secret (``***``), is skipped
with the reason; the others go on, and the exit status is then 1.

Trust. A store is anyone's to write, so a run's recorded source and argv are data until
trusted: a run replays only when ``run.json``'s ``signature`` signs both with the user's key or
a key in the ``trusted-keys`` folder (:mod:`flor.store.trust`), or when the user opts in for it
with ``--trust RUN:DIGEST``, the token ``--dry-run`` prints beside what it shows (the digest
covers the argv and source shown, so a run changed after the review is not run). Otherwise the
run is skipped with one line saying how to trust it. flor's own flags in a recorded argv are
never applied (:func:`flor.settings.strip_flor_flags`): a worker's settings come from the
user's command line and environment only.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, TextIO

from .._files import read_bytes, read_text
from .._fmt import printable, progress
from ..errors import ConfigError
from ..findings import line
from ..placement import cores
from ..settings import strip_flor_flags
from ..store import ExperimentStore
from ..store.runlogs import read_run_logs
from ..store.runmeta import RunMeta
from ..store.trust import TRUSTED_KEYS, run_bytes, verify_run
from ..source.edits import non_logging_changes
from .executor import Executor
from .launcher import Launch, abort_launches, start_error, stop_workers
from ..source.transplant import TransplantError, transplant, unified_patch
from .workers import WorkerState

__all__ = ["SweepRun", "parse_where", "plan_sweep", "run_sweep", "select_runs"]


@dataclass
class SweepRun:
    """One run of a sweep: what it will run, or why it is skipped."""

    run: str
    meta: RunMeta
    command: list[str] = field(default_factory=list)
    version: str = ""  # "today's script", "recorded script + today's logging", ...
    script_sha: str | None = None  # sha256 of the script that runs
    transplanted: str | None = None  # its text, when it is the run's own source with today's logging
    recorded: str | None = None  # the run's recorded source
    env: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None
    args: list[str] = field(default_factory=list)  # the recorded arguments it runs with
    dropped: list[str] = field(default_factory=list)  # flor's own flags in the recorded argv: never applied
    unsigned: str | None = None  # why its recorded code and argv are not trusted (None: signed by a trusted key)
    token: str = ""  # RUN:DIGEST, what --trust takes to run it unsigned
    today: str | None = None  # today's script, for --dry-run's diff


def parse_where(exprs: Sequence[str]) -> list[tuple[str, Any]]:
    """``["lr=0.001", "seed=1"]`` -> ``[("lr", 0.001), ("seed", 1)]``: values typed as JSON, else strings.

    >>> parse_where(["lr=1e-3", "opt=adam", "aug=true"])
    [('lr', 0.001), ('opt', 'adam'), ('aug', True)]
    """
    out = []
    for e in exprs:
        key, eq, value = e.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--where {e!r}: give a hyperparameter and a value like lr=0.001")
        try:
            typed = json.loads(value)
        except ValueError:
            typed = value
        out.append((key.strip(), typed))
    return out


def select_runs(store: ExperimentStore, *, every: bool, runs: Sequence[str], where: Sequence[str]) -> list[str]:
    """The runs of a sweep: ``--all``, ``--runs`` ids or prefixes, and/or every ``--where`` (ANDed)."""
    chosen = store.select_runs("all") if every or not runs else store.select_runs(list(runs))
    if not chosen:
        raise ConfigError(f"{store.name} has no runs; record some with `python train.py --flor {store.name}`")
    conditions = parse_where(where)
    if conditions:
        hps = {r: store.read_run(r).hyperparameters for r in chosen}
        known = {k for h in hps.values() for k in h}
        for key, _ in conditions:
            if key not in known:
                raise ConfigError(f"--where {key}=...: no run records the hyperparameter {key!r}; the runs have: "
                                  f"{', '.join(sorted(known)) or 'none (record with argparse or flor.arg)'}")
        chosen = [r for r in chosen if all(k in hps[r] and hps[r][k] == v for k, v in conditions)]
        if not chosen:
            raise ConfigError(f"no run of {store.name} has {' and '.join(where)}; `flor ls {store.name}` lists them")
    return chosen


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _split_command(command: Sequence[str]) -> tuple[list[str], Path]:
    words = list(command)
    at = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if at is None:
        raise ConfigError(f"give the interpreter and the training script after --, e.g. -- python train.py "
                          f"(the command was: {' '.join(words) or 'empty'})")
    if at != len(words) - 1:
        raise ConfigError(f"give only the interpreter and the script after -- (not {' '.join(words[at + 1:])}): "
                          "each run is replayed with its own recorded arguments")
    return words[:at], Path(words[at])


def plan_sweep(store: ExperimentStore, runs: Sequence[str], command: Sequence[str], *,
               config_dir: Path | None = None, trusted: Sequence[str] = ()) -> list[SweepRun]:
    """What each run will run: today's script, or its own source with today's logging; or why it
    is skipped. A run whose recorded argv and source are not signed by a key the user trusts
    (``config_dir``'s key or trusted keys) is skipped unless its token is in ``trusted``."""
    prefix, script = _split_command(command)
    try:
        today = script.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the script {script}: {exc}") from exc
    out = []
    for run in runs:
        meta = store.read_run(run)
        sr = SweepRun(run, meta, today=today)
        out.append(sr)
        if meta.epochs == 0:
            sr.skipped = f"it recorded no finished epoch (status {meta.status_text()}): there is nothing to replay"
            continue
        args, sr.dropped = strip_flor_flags(list(meta.argv)[1:])
        sr.args = args
        secret = next((i for i, w in enumerate(args) if "***" in w), None)
        if secret is not None:
            word = args[secret]
            flag = word.split("=", 1)[0] if word.startswith("-") else (args[secret - 1] if secret else word)
            sr.skipped = (f"its argument {printable(flag, newlines=False)} was recorded redacted (***); replay it by "
                          f"hand with `flor replay {store.name} --run {run} -- python {script} ARGS`")
            continue
        source = store.layout(run).source / Path(meta.script or script.name).name
        try:
            raw = read_bytes(source)  # a regular file, capped, no link followed
            recorded: str | None = raw.decode("utf-8", errors="replace")
            source_sha: str | None = hashlib.sha256(raw).hexdigest()
        except OSError:  # missing, or not a file: as if no copy was kept
            recorded = source_sha = None
        sr.recorded = recorded
        if config_dir is not None:
            sr.token = f"{run}:{hashlib.sha256(run_bytes(list(meta.argv), source_sha)).hexdigest()[:16]}"
            sr.unsigned = verify_run(meta.signature, list(meta.argv), source_sha, config_dir)
        _plan_script(store, sr, prefix, script, today)
        if sr.unsigned is not None and sr.token not in trusted and not sr.skipped:
            sr.skipped = (f"its recorded script and arguments are not trusted: {sr.unsigned}. Review them with "
                          f"`flor replay {store.name} --runs {run} --dry-run -- ...`, then add --trust {sr.token}; "
                          f"or put the recorder's key in {Path(config_dir or '.') / TRUSTED_KEYS}/")
    return out


def _plan_script(store: ExperimentStore, sr: SweepRun, prefix: list[str], script: Path, today: str) -> None:
    """Today's script when the recorded one differs by logging only, else the recorded one with
    today's logging moved in; ``sr.skipped`` when that cannot be done."""
    recorded, args = sr.recorded, sr.args
    if recorded is None or not non_logging_changes(recorded, today):
        sr.command, sr.script_sha = [*prefix, str(script), *args], _sha(today)
        sr.version = "today's script" if recorded is not None else "today's script (no recorded source)"
        return
    try:
        t = transplant(recorded, today)
    except TransplantError as exc:
        sr.skipped = f"its script is an older version, and {exc}"
        return
    sr.transplanted, sr.script_sha = t.source, _sha(t.source)
    sr.version = "recorded script + today's logging" if t.changed else "recorded script (no logging added)"
    path = store.layout(sr.run).transplant(sr.script_sha, script.name)
    sr.command = [*prefix, str(path), *args]
    here = str(script.resolve().parent)  # today's siblings import as they did beside the script
    sr.env = {"PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])}


def print_dry_run(store: ExperimentStore, plan: list[SweepRun], script: str, out: TextIO) -> None:
    """``--dry-run``: what each run would run: its full argv, its recorded script's diff against
    today's, the patch of each transplanted script, and whether it is signed (with the token
    ``--trust`` takes when it is not). Everything from the store is printed inert."""
    name = Path(script).name
    for sr in plan:
        hp = printable(" ".join(f"{k}={v}" for k, v in sr.meta.hyperparameters.items()), newlines=False)
        if sr.skipped and not sr.command:
            out.write(f"run {sr.run} ({hp}): SKIPPED: {sr.skipped}\n")
            continue
        assert sr.script_sha is not None  # a run with a command has the sha of its script
        out.write(f"run {sr.run} ({hp}): {sr.version} (sha256 {sr.script_sha[:12]})\n")
        if sr.unsigned is not None:
            out.write(f"  UNSIGNED: {sr.unsigned}; to replay it as shown: --trust {sr.token}\n")
        out.write(f"  argv: {printable(shlex.join(sr.command), newlines=False)}\n")
        if sr.dropped:
            out.write(f"  flor's own flags in the recorded argv, never applied: "
                      f"{printable(shlex.join(sr.dropped), newlines=False)}\n")
        if sr.recorded is not None and sr.today is not None and sr.recorded != sr.today:
            out.write(f"  the recorded script against today's {name}:\n")
            diff = difflib.unified_diff(sr.recorded.splitlines(keepends=True), sr.today.splitlines(keepends=True),
                                        f"recorded/{name}", f"today/{name}")
            out.write(printable("".join(diff)))
        if sr.transplanted is not None and sr.recorded is not None:
            out.write("  the script it runs (the recorded one with today's logging):\n")
            patch = unified_patch(sr.recorded, sr.transplanted, name)
            out.write(printable(patch) or "  (the recorded script as it is: today's logging has nothing to place)\n")


def _hindsight_values(store: ExperimentStore, run: str, replay: str, names: Sequence[str]) -> dict[str, Any]:
    last: dict[str, Any] = {}
    for r in read_run_logs(store.run_path(run), run):
        if r["source"] == "replay" and r["replay"] == replay and r["name"] in names:
            last[r["name"]] = r["value"]  # in epoch order: the last one stays
    return last


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "-" if v is None else str(v)


def render_table(rows: list[dict[str, Any]], hp_names: list[str], metrics: list[str]) -> str:
    head = ["run", *hp_names, "script", "verdict", *metrics]
    body = [[r["run"], *(_cell(r["hparams"].get(h)) for h in hp_names), r["script"], r["verdict"],
             *(_cell(r["values"].get(m)) for m in metrics)] for r in rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *body])


def run_sweep(store: ExperimentStore, plan: list[SweepRun], *, executor: Executor, workers: int | None,
              gpus: list[str], strong: bool, threads: int | None, fresh: bool,
              out: TextIO = sys.stdout, err: TextIO = sys.stderr, verdict: str | None = None) -> int:
    """Replay every run of ``plan`` through one pool of ``workers`` processes; print one table.

    Exit status: 0 all verified, 3 one diverged (strict), 1 a run was skipped or a worker failed."""
    todo = [sr for sr in plan if not sr.skipped]
    pool = workers or len(gpus) or cores()
    lock = threading.Lock()
    for sr in plan:
        if sr.skipped:
            err.write(f"flor: run {sr.run} skipped: {printable(sr.skipped)}\n")
        elif sr.dropped:
            err.write(line("FL416", f"run {sr.run}: flor's own flags in its recorded argv are not applied "
                                    f"({printable(shlex.join(sr.dropped), newlines=False)}); flor's settings come "
                                    "from your command line and environment") + "\n")
    launches: list[tuple[SweepRun, Launch]] = []
    per_run = max(1, math.ceil(pool / max(1, len(todo))))  # runs x segments fill the pool
    for i, sr in enumerate(todo):
        if sr.transplanted is not None:  # kept with the run; the same content, the same path
            path = Path(sr.command[len(sr.command) - len(sr.args) - 1])
            try:
                same = read_text(path) == sr.transplanted  # a regular file, no link followed
            except OSError:  # missing, or a link or FIFO planted in its place
                same = False
            if not same:  # an atomic replace: a link planted at the path is replaced, never written through
                store.backend.write(path.relative_to(store.root).as_posix(), sr.transplanted.encode())
        launch = Launch(store, sr.run, sr.command, workers=min(per_run, max(1, sr.meta.epochs)), gpus=gpus,
                        epoch_range=None, strong=strong, threads=threads, fresh=fresh, out=out, err=err,
                        keep_finished=True, verdict=verdict)
        launch.tag, launch.extra_env, launch.lock = f"r{i} ", sr.env, lock
        launches.append((sr, launch))
    executor.open()
    queue: list[tuple[Launch, WorkerState]] = []
    for sr, launch in launches:
        err.write(f"flor: r{launches.index((sr, launch))} = run {sr.run}: {sr.version}\n")
        queue.extend((launch, s) for s in launch.prepare())
    started: list[tuple[Launch, WorkerState, int]] = []
    total = sum(len(s.plan.segment) for _, L in launches for s in L.states)
    bar = progress(total, f"sweep replay of {store.name}", stream=err, unit="epoch",
                   bar_format="{desc}: |{bar}| {n_fmt}/{total_fmt} epochs{postfix}")
    for _, launch in launches:
        launch.bar = bar
    pumps: list[threading.Thread] = []
    free = list(range(pool))
    try:
        while queue or any(s.rc is None for _, s, _ in started):
            for launch, s, slot in started:
                if s.rc is None and s.handle is not None:
                    s.read_marks(launch.marks(s))
                    s.rc = s.handle.poll()
                    if s.rc is not None:
                        s.exited = time.time()
                        free.append(slot)
            while queue and free:
                launch, s = queue.pop(0)
                slot = free.pop(0)
                env = launch.env(s.index)
                if gpus:  # the pool's slot, not the worker's index, picks the GPU
                    env["CUDA_VISIBLE_DEVICES"] = gpus[slot % len(gpus)]
                s.spawned = time.time()
                try:
                    s.handle = executor.start(s.index, launch.command, env, threads=launch.estimate.threads)
                except Exception as exc:  # no launch record may stay "running"
                    raise abort_launches([L for _, L in launches], [x for _, x, _ in started], pumps,
                                         f"run {launch.run}: {start_error(s, exc)}") from exc
                started.append((launch, s, slot))
                pumps.append(threading.Thread(target=launch.pump, args=(s,), daemon=True))
                pumps[-1].start()
            done = sum(len(s.plan.segment) if s.skipped else min(s.done_epochs, len(s.plan.segment))
                       for _, L in launches for s in L.states)
            running = sum(1 for _, s, _ in started if s.rc is None)
            if not bar.disable:
                with lock:
                    bar.n = done
                    bar.set_postfix_str(f"{running} running, {len(queue)} queued", refresh=False)
                    bar.refresh()
            time.sleep(0.25)
    except KeyboardInterrupt:
        stop_workers([s for _, s, _ in started])
        queue.clear()
        err.write("\nflor: interrupted; run the same command again to replay only the missing segments\n")
    for t in pumps:
        t.join(timeout=2.0)
    with lock:
        bar.n = sum(min(s.done_epochs, len(s.plan.segment)) if not s.skipped else len(s.plan.segment)
                    for _, L in launches for s in L.states)
        bar.close()
    for _, launch in launches:
        launch.bar = None
    return _conclude(store, plan, launches, out, err)


def _conclude(store: ExperimentStore, plan: list[SweepRun], launches: list[tuple[SweepRun, Launch]],
              out: TextIO, err: TextIO) -> int:
    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    names: list[str] = []
    results: dict[str, tuple[str, Launch, dict]] = {}
    for sr, launch in launches:
        mine = [s for s in launch.states if not s.skipped]  # started or not: a sweep interrupted leaves some queued
        for s in mine:
            s.read_marks(launch.marks(s))
        rc, summary = launch.finish(mine, show=False)
        codes.append(rc)
        if rc == 1:
            err.write(summary["text"] + "\n")  # a failure's details: which worker, its last lines
        verdict = "failed" if rc == 1 else summary.get("verdict") or "?"
        names.extend(n for n in summary.get("hindsight") or [] if n not in names)
        results[sr.run] = (verdict, launch, summary)
    for sr in plan:
        if sr.run in results:
            verdict, launch, summary = results[sr.run]
            values = {} if verdict == "failed" else _hindsight_values(  # a part of the epochs: not the last value
                store, sr.run, launch.replay_id, summary.get("hindsight") or [])
        else:
            verdict, values = "skipped", {}
        what = "today" if sr.version.startswith("today") else "recorded+log" if sr.transplanted else "-"
        rows.append({"run": sr.run, "hparams": sr.meta.hyperparameters, "verdict": verdict, "values": values,
                     "script": f"{sr.script_sha[:12]} ({what})" if sr.script_sha else "-"})
    hps = [r["hparams"] for r in rows]
    hp_names = [k for k in dict.fromkeys(k for h in hps for k in h) if len({json.dumps(h.get(k)) for h in hps}) > 1]
    same = {k: v for k, v in (hps[0] if hps else {}).items() if k not in hp_names}
    out.write(f"flor: sweep replay of {store.name}: {len(plan)} runs"
              + (f" (the same in every run: {' '.join(f'{k}={v}' for k, v in same.items())})" if same else "")
              + ("; hindsight values: the last of each" if names else "") + "\n")
    out.write(render_table(rows, hp_names, names) + "\n")
    skipped = sum(1 for sr in plan if sr.skipped)
    failed, diverged = codes.count(1), codes.count(3)
    status = 1 if skipped or failed else 3 if diverged else 0
    counts = ", ".join(f"{n} {w}" for n, w in [(len(plan) - skipped - failed - diverged, "replayed"),
                                                (diverged, "diverged"), (failed, "failed"), (skipped, "skipped")] if n)
    out.write(f"flor: sweep: {counts}; exit status {status}\n")
    out.flush()
    return status
