"""What a replay of a recorded run will cost: the inputs of ``flor.plan``'s cost model.

The model (``flor.plan.estimate``): a worker takes its startup, plus, for each epoch it runs,
the epoch's outer-loop seconds and, per block, either a restore (checkpointed and not probed,
or any initialization epoch) or the block's recorded run time (probed, or no checkpoint) plus
a check against the checkpoint. Workers that share cores (or a GPU) stretch by the share.

Its inputs, all from the run directory:

* per epoch, ``run.json``'s ``timings.epoch_s`` less its blocks' time and the recording's own
  snapshot time (a replay does not snapshot): the outer-loop seconds;
* per block, its manifest's ``block_s`` (run time) and ``bytes`` (restore time, at
  ``RESTORE_BYTES_S`` plus ``RESTORE_FIXED_S`` a checkpoint); ``timings.blocks`` where an
  epoch has no manifest;
* startup: a worker's time outside its epochs (start-up to the first epoch, and wind-down
  after the loop: summary, exit), as the last ``flor replay`` of the run measured it, else as
  the recording spent it plus what a replay adds to that (``replay_extra``), else
  ``DEFAULT_STARTUP_S``;
* which blocks the script now probes: ``step_into(..., probed=...)`` read from its source.

On CPU the model also counts other processes' load (``/proc/loadavg``'s running tasks): the
recording's timings are divided by the share of the cores it had (``run.json``'s
``busy_cores``), and a replay's workers are stretched by the share they will have now.

No torch here: the launcher imports this to print ``--plan`` before anything runs.
"""

from __future__ import annotations

import ast
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

from .._files import lines, read_lines
from ..errors import FlorError
from ..placement import cores
from ..plan import BlockCost, EpochCost, estimate, fastest, make_plan, restorable_epochs
from ..runinfo import busy_cores, process_started
from ..store import ExperimentStore
from ..store.layout import RunLayout, marks_of
from ..store.runmeta import RunMeta
from .records import read_launch_record

__all__ = ["ReplayEstimate", "cores", "cpu_share", "epoch_costs", "estimate_replay", "load", "probed_blocks", "startup",
           "wait_policy"]

#: restore cost of a checkpoint: a fixed part (manifest, files, restore calls) and a rate
#: (read, hash check, copy into the live tensors), measured on a 2-core VM with a warm page cache
RESTORE_FIXED_S = 0.004
RESTORE_BYTES_S = 400e6
#: a worker's startup when neither the recording nor an earlier replay tells it
DEFAULT_STARTUP_S = 5.0
#: what a replay worker spends outside its epochs beyond what its recording measured of its own
#: (the interpreter's teardown after the last flor call, which no process can time itself: 0.7-1.0 s
#: with torch and scikit-learn loaded on this project's 2-core VM; the replay's own set-up and
#: summary): 1.46, 1.63 and 2.32 s measured there (12-08) for the benchmarks' LSTM, probed CNN and
#: digits CNN scripts, 1.5-2.2 s before; 1.0 s made the first plans read 0.70-0.85 of the launch.
#: Used where no replay of the experiment measured it yet (``replay_extra``)
DEFAULT_REPLAY_EXTRA_S = 1.5
#: runs of the experiment searched, newest first, for a launch that measured ``replay_extra_s``
EXTRA_RUNS_SEARCHED = 20


def load() -> float:
    """Cores other processes keep busy now (sampled for 0.2 s; 0 where unknown). Sampled once
    for a few seconds: a launch that picks its worker count estimates twice, and each sample
    was 0.2 s of its start-up."""
    global _LOAD
    now = time.monotonic()
    if _LOAD is None or now - _LOAD[0] > LOAD_KEPT_S:
        _LOAD = (now, busy_cores(samples=10) or 0.0)
    return _LOAD[1]


#: how long a sample of ``load`` is used again
LOAD_KEPT_S = 5.0
_LOAD: tuple[float, float] | None = None


def launcher_s() -> float:
    """Seconds this process has run so far (the interpreter, flor's imports, reading the run, the
    estimate): what a ``flor replay`` launch spends before its first worker starts, as the
    ``--plan`` or launch that calls this did; 0 where unknown."""
    started = process_started()
    return round(max(0.0, time.time() - started), 3) if started else 0.0


def cpu_share(threads: float, busy: float) -> float:
    """How much slower CPU-bound work runs when ``threads`` threads of ours and a load of
    ``busy`` from other processes share this machine's cores (at least 1)."""
    return max(1.0, (threads + busy) / cores())


def probed_blocks(script: Path | None) -> set[str] | Literal[True]:
    """Names of the blocks ``script`` probes (``step_into(NAME, probed=...)`` with anything
    but a literal False); True when a probed block's name is not a literal; empty when the
    script cannot be read."""
    if script is None or not script.is_file():
        return set()
    try:
        tree = ast.parse(script.read_text(errors="replace"))
    except SyntaxError:
        return set()
    out: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or getattr(node.func, "attr", getattr(node.func, "id", None)) != "step_into":
            continue
        probed = next((k.value for k in node.keywords if k.arg == "probed"), None)
        if probed is None and len(node.args) > 1:
            probed = node.args[1]
        if probed is None or (isinstance(probed, ast.Constant) and not probed.value):
            continue
        name = node.args[0] if node.args else None
        if not isinstance(name, ast.Constant) or not isinstance(name.value, str):
            return True
        out.add(name.value)
    return out


def _restore_s(nbytes: float) -> float:
    return RESTORE_FIXED_S + nbytes / RESTORE_BYTES_S


def epoch_costs(store: ExperimentStore, run: str, meta: RunMeta) -> list[EpochCost]:
    """The recorded cost of every epoch of ``run``, for ``flor.plan.estimate``."""
    manifests: dict[tuple[str, int, int], dict] = {}
    for block, epoch, occ in store.manifests(run):
        if epoch is None:
            continue
        try:
            manifests[(block, epoch, occ)] = store.read_manifest(run, block, epoch, occ)
        except FlorError:  # an unreadable checkpoint is re-executed; cost it so
            continue
    timings = meta.timings
    epoch_s = list(timings.get("epoch_s") or [])
    by_name = {name: list(ts) for name, ts in (timings.get("blocks") or {}).items()}
    mean = {name: (sum(ts) / len(ts) if ts else 0.0) for name, ts in by_name.items()}
    sizes = [float(m.get("bytes") or 0) for m in manifests.values()]
    typical_bytes = sum(sizes) / len(sizes) if sizes else 0.0
    n = meta.epochs or len(epoch_s)
    costs: list[EpochCost] = []
    for e in range(n):
        blocks, snap = [], 0.0
        for name, occ in meta.epoch_blocks.get(str(e), []):
            m = manifests.get((name, e, occ))
            run_s = float(m["block_s"]) if m and m.get("block_s") is not None else mean.get(name, 0.0)
            nbytes = float(m.get("bytes") or 0) if m else typical_bytes
            snap += float(m.get("snapshot_s") or 0) if m else 0.0
            blocks.append(BlockCost(name, run_s, _restore_s(nbytes), m is not None))
        full = epoch_s[e] if e < len(epoch_s) else sum(b.run_s for b in blocks)
        costs.append(EpochCost(max(0.0, full - sum(b.run_s for b in blocks) - snap), tuple(blocks)))
    return costs


def _marks_times(marks: Path) -> tuple[float | None, float | None]:
    """When the recording's first epoch began and its loop ended, from its output marks."""
    first = after = None
    try:
        with read_lines(marks) as fh:  # a regular file, no link followed
            for line in lines(fh):
                rec = json.loads(line)
                if rec.get("mark") == "epoch" and first is None:
                    first = float(rec["t"])
                elif rec.get("mark") == "after":
                    after = float(rec["t"])
    except (OSError, ValueError, KeyError):
        pass
    return first, after


def startup(run_dir: Path, meta: RunMeta) -> tuple[float, str]:
    """Seconds from a worker's start to its first epoch, and where the number comes from: the
    last ``flor replay`` of the run, else the recording (``recorded_startup``; without what a
    replay adds to it, ``replay_extra``), else ``DEFAULT_STARTUP_S``."""
    measured = measured_startup(run_dir)
    if measured is not None:
        return measured, "measured by the last flor replay of this run"  # already per unit of sharing
    recorded = recorded_startup(run_dir, meta)
    if recorded is not None:
        return recorded, "the recording's start-up and wind-down"
    return DEFAULT_STARTUP_S, "assumed: nothing measured yet"


def measured_startup(run_dir: Path) -> float | None:
    """A worker's start-up and wind-down as the run's last launch measured it (the median of its
    workers), per unit of its sharing; None where no launch measured it."""
    measured: list[tuple[float, float]] = []
    for path in RunLayout(run_dir).launch_records():
        rec = read_launch_record(path)  # None for a file of another shape (one warning)
        if rec is None:
            continue
        # what that launch's sharing made of it: its start-up's own stretch (one thread a worker);
        # none for records before it was kept (they stretched start-up like the epochs, wrongly)
        share = min(max(float(rec.get("startup_slowdown") or 1.0), 1.0), 1e3)  # bounded: a planted record
        values = [w["startup_s"] / share for w in rec.get("segments", []) if w.get("startup_s") is not None]
        if values:
            measured.append((float(rec.get("started") or 0), sorted(values)[len(values) // 2]))
    return max(measured)[1] if measured else None


def recorded_startup(run_dir: Path, meta: RunMeta) -> float | None:
    """The recording's seconds from its process's start to its first epoch, plus its wind-down
    from the loop's end to its session's close; None where its marks do not tell."""
    first, after = _marks_times(marks_of(RunLayout(run_dir).stdout))
    if first is None or not meta.process_started:
        return None
    wind_down = max(0.0, float(meta.ended or 0) - after) if after is not None else 0.0
    return max(0.0, first - float(meta.process_started)) + wind_down


def replay_extra(store: ExperimentStore, run: str) -> tuple[float, str]:
    """Seconds a replay worker spends outside its epochs beyond its recording's start-up and
    wind-down (``recorded_startup``), and where the number comes from: the newest launch of
    another run of the experiment that measured it (its record's ``replay_extra_s``), else
    ``DEFAULT_REPLAY_EXTRA_S``. Part of it comes after the recording's last flor call (the
    interpreter's teardown: modules, torch's threads), which only a launch sees from outside."""
    for other in sorted((r for r in store.runs() if r != run), reverse=True)[:EXTRA_RUNS_SEARCHED]:
        found: list[tuple[float, float]] = []
        for path in RunLayout(store.run_path(other)).launch_records():
            rec = read_launch_record(path) or {}
            extra = rec.get("replay_extra_s")
            if extra is not None and 0.0 <= extra <= MAX_REPLAY_EXTRA_S:  # bounded: a planted record
                found.append((float(rec.get("started") or 0), float(extra)))
        if found:
            return max(found)[1], f"measured by the last flor replay of run {other}"
    return DEFAULT_REPLAY_EXTRA_S, "assumed"


#: a launch record's ``replay_extra_s`` above this is not believed
MAX_REPLAY_EXTRA_S = 600.0


#: an asked worker count estimated this much slower than the fastest count is named (FL504)
SLOWER_BY = 1.15


@dataclass
class ReplayEstimate:
    """The plan and estimated seconds of a replay with ``workers`` workers, and the fastest count."""

    workers: int
    plans: list[Any]
    seconds: list[float]
    fastest: tuple[int, float]
    by_count: dict[int, float]
    startup_s: float
    startup_from: str
    probed: set[str] | Literal[True]
    slowdown: float
    threads: int
    busy: float = 0.0  # the load of other processes when estimated
    startup_slowdown: float = 1.0  # the start-up's stretch (one thread a worker)
    notes: list[str] = field(default_factory=list)
    recorded_startup_s: float | None = None  # the recording's own start-up, per unit of sharing (``replay_extra``)
    launcher_s: float = 0.0  # the launcher's own time before its workers start (``launcher_s``)

    @property
    def total_s(self) -> float:
        """The launch's seconds: its slowest worker's, and the launcher's own before them."""
        return (max(self.seconds) if self.seconds else 0.0) + self.launcher_s

    def slower_than_fewer(self) -> str | None:
        """A note where these workers are estimated slower than fewer (each worker's start-up
        against its segment's work, workers sharing the cores) by more than ``SLOWER_BY``.

        Both sides without the launcher's own time, which every count pays (a count past this
        machine's cores is not in ``by_count``: its workers' seconds alone, not ``total_s``), and
        both said with it, as ``--plan`` says its estimated time.

        >>> est = ReplayEstimate(2, [], [9.0, 8.0], (1, 6.0), {1: 6.0, 2: 9.0}, 2.0, "", set(), 1.6, 1)
        >>> est.slower_than_fewer()[:60]
        '--workers 2: estimated 9.0 s, slower than 1 worker(s) at 6.0'
        >>> ReplayEstimate(2, [], [6.5], (1, 6.0), {1: 6.0, 2: 6.5}, 2.0, "", set(), 1.0, 1).slower_than_fewer()
        >>> ReplayEstimate(2, [], [6.5], (1, 6.0), {1: 6.0}, 2.0, "", set(), 1.0, 2, launcher_s=1.0).slower_than_fewer()
        """
        best, best_s = self.fastest
        mine = self.by_count.get(self.workers, max(self.seconds, default=0.0))
        if best >= self.workers or mine <= best_s * SLOWER_BY:
            return None
        mine, best_s = mine + self.launcher_s, best_s + self.launcher_s
        return (f"--workers {self.workers}: estimated {mine:.1f} s, slower than {best} worker(s) at {best_s:.1f} s "
                f"on this machine (each worker's start-up against its segment's work; `flor replay --plan` shows "
                f"each count)")


def wait_policy(n: int, threads: int, gpus: Sequence[str] | None) -> str | None:
    """The OpenMP wait policy a launch gives its ``n`` workers of ``threads`` torch threads:
    ``PASSIVE`` where together they ask more threads than this machine has cores and the user set
    none (``OMP_WAIT_POLICY``), else None (OpenMP's own).

    OpenMP's threads spin while they wait for their team: a team that loses a core to another
    worker's keeps spinning on the cores the other needs (2 probed workers of 2 threads on 2 cores
    took 1.2-3.1x one worker's time). Passive threads sleep instead (1.0-1.2x). Values do not
    change: the policy decides how a thread waits, not how the work is split among them.

    >>> import flor.launch.estimate as e; cores = e.cores; e.cores = lambda: 2
    >>> [wait_policy(n, t, None) for n, t in ((1, 2), (2, 1), (2, 2), (1, 4))], wait_policy(2, 2, ["0"])
    ([None, None, 'PASSIVE', 'PASSIVE'], None)
    >>> e.cores = cores
    """
    if gpus or n * threads <= cores() or os.environ.get("OMP_WAIT_POLICY", "").strip():
        return None
    return "PASSIVE"


def _spins(n: int, threads: int, gpus: Sequence[str] | None) -> bool:
    """Whether the OpenMP threads of ``n`` workers spin while they wait (``wait_policy``)."""
    policy = wait_policy(n, threads, gpus) or os.environ.get("OMP_WAIT_POLICY", "")
    return policy.strip().upper() != "PASSIVE"


def _slowdown(n: int, threads: int, gpus: Sequence[str] | None, busy: float) -> float:
    """How much slower each of ``n`` workers of ``threads`` torch threads runs its epochs.

    On the CPU, their share of the cores; where teams of several threads share cores with other
    processes' load while spinning (``wait_policy``: a launch's own workers that exceed the cores
    wait passively), that share again: a team that loses its core keeps it busy for nothing.

    >>> import flor.launch.estimate as e, os; cores = e.cores; e.cores = lambda: 2
    >>> policy = os.environ.pop("OMP_WAIT_POLICY", None)
    >>> [_slowdown(n, t, None, 0.0) for n, t in ((1, 2), (2, 1), (2, 2), (3, 1))]
    [1.0, 1.0, 2.0, 1.5]
    >>> _slowdown(1, 2, None, 1.0), _slowdown(4, 2, ["cuda:0", "cuda:1"], 0.0)
    (2.25, 2.0)
    >>> os.environ["OMP_WAIT_POLICY"] = "active"; _slowdown(2, 2, None, 0.0)
    4.0
    >>> e.cores = cores; _ = os.environ.pop("OMP_WAIT_POLICY")
    >>> if policy is not None: os.environ["OMP_WAIT_POLICY"] = policy
    """
    if gpus:
        return float(-(-n // len(gpus)))  # workers sharing one GPU take turns
    share = cpu_share(n * threads, busy)
    return share * share if threads > 1 and share > 1.0 and _spins(n, threads, gpus) else share


def _unshared(costs: list[EpochCost], share: float) -> list[EpochCost]:
    """The recording's timings as they would be on an idle machine: divided by the CPU share it had."""
    return [EpochCost(c.outer_s / share, tuple(BlockCost(b.name, b.run_s / share, b.restore_s, b.checkpointed)
                                               for b in c.blocks)) for c in costs]


def estimate_replay(store: ExperimentStore, run: str, meta: RunMeta, *, workers: int, script: Path | None,
                    within: range | None = None, strong: bool = False, threads: int | None = None,
                    gpus: Sequence[str] | None = None) -> ReplayEstimate:
    """Plan ``workers`` workers over ``run`` and estimate their time, and the fastest count."""
    costs = epoch_costs(store, run, meta)
    restorable = restorable_epochs(meta.epoch_blocks, set(store.manifests(run)))
    start_s, source = startup(store.run_path(run), meta)
    recorded = recorded_startup(store.run_path(run), meta)
    t = int(threads or meta.torch_threads or 1)
    busy = 0.0
    if not gpus:  # on CPU, other processes' load slowed the recording and will slow the replay
        recorded_share = cpu_share(int(meta.torch_threads or 1), float(meta.busy_cores or 0.0))
        costs = _unshared(costs, recorded_share)
        if recorded is not None:
            recorded /= recorded_share
        if source.startswith("the recording"):
            start_s /= recorded_share
        busy = load()
    if source.startswith("the recording"):
        extra, why = replay_extra(store, run)
        start_s += extra
        source += f", plus {extra:.1f} s a replay adds ({why})"

    probed = probed_blocks(script)
    kw: dict[str, Any] = {"startup_s": start_s, "probed": probed, "strong": strong, "within": within}

    def stretch(n: int) -> dict[str, Any]:  # the epochs' and the start-up's (one thread a worker, on the CPU)
        return {"slowdown": _slowdown(n, t, gpus, busy), "startup_slowdown": cpu_share(n, busy)}

    seconds = estimate(costs, workers, restorable, **stretch(workers), **kw)
    limit = len(gpus) if gpus else max(1, cores() // t)
    by_count = {n: max(estimate(costs, n, restorable, **stretch(n), **kw))
                for n in range(1, max(1, min(limit, len(within) if within is not None else len(costs))) + 1)}
    best = fastest(costs, restorable, max_workers=limit, slowdown=lambda n: _slowdown(n, t, gpus, busy),
                   startup_slowdown=lambda n: cpu_share(n, busy), **kw)
    plans = [make_plan(len(costs), p, workers, restorable, strong=strong, within=within) for p in range(workers)]
    return ReplayEstimate(workers, plans, seconds, best, by_count, start_s, source, probed,
                          _slowdown(workers, t, gpus, busy), t, busy=busy, startup_slowdown=cpu_share(workers, busy),
                          recorded_startup_s=recorded)
