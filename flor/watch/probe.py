"""One protocol for the script's state outside ``end()``, and the one runner of its probes.

A block run hands every probe one view of it (``View``): the block, its epoch and occurrence,
the script's frame, whether this is the block's first run in this process, and at ``end()``
what it was given and the ids of those objects (``given_ids``, computed once). A probe has four
verbs, each optional:

=============  ===========================================================================
``enter``      at ``step_into`` (record and replay): note what the block starts from
``leave``      at ``end()``: while recording, put what it notes into ``view.noted`` (it
               travels with the block's run) and name what it cannot note
``restore``    at ``end()`` of a block a replay restored, before ``leave``: set what was
               noted; return the names left as they were (the verdict names them)
``check``      at ``step_into`` while replaying: compare with what was noted; return what
               differs (the verdict names it)
``compare``    at ``end()`` of a block a replay re-executed where a checkpoint exists:
               compare what the block left with what the recording's run noted; return
               what differs (verified like the objects given to ``end()``)
=============  ===========================================================================

A probe never prints: it says findings (``say(code, subject, text)``), and ``Watch`` says each
(code, subject) once. ``Watch`` is the only place that catches a probe's exception (a probe
that fails is silent for that run of the block: it only advises, or notes less), and it times
the probes, so the recording charges their time to the overhead budget
(``flor.policy.CheckpointPolicy.observe_watch``).

A new kind of state is a new probe in its own file of this package, with in-process unit tests
(a test function's own frame is a real frame).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Callable, Iterable

from .frames import frame_variables, given_ids

__all__ = ["Probe", "Say", "View", "Watch"]

#: ``say(code, subject, text)``: a finding of ``flor.findings.CATALOGUE`` about ``subject``
#: (its result, such as whether ``warn_once`` warned, is ignored)
Say = Callable[[str, Any, str], object]


#: a steady run's verbs are timed once in this many calls (``Watch._run_steady``)
STEADY_TIMED = 16


@dataclass(slots=True)
class View:
    """One run of a block, as every probe sees it."""

    block: str
    epoch: int | None
    occ: int
    frame: FrameType | None
    first: bool  # the block's first run in this process
    replay: bool = False  # a replay's block run: ``leave`` notes nothing (a probe may still look)
    #: recording: this run is checkpointed, so what it changes outside end() is noted (a run without a
    #: checkpoint is re-executed by a replay: its variables come from there); replaying: always
    note: bool = True
    objs: tuple = ()  # what end() was given (at leave and restore)
    #: what the probes noted so far at this leave, by part (``vars``, ``globals``, ``attrs``, ``outside``)
    noted: dict[str, Any] = field(default_factory=dict)
    #: names already set as noted or named by a finding: a later probe does not name them again
    named: set[str] = field(default_factory=set)
    _variables: dict[str, Any] | None = field(default=None, repr=False)
    _given: set[int] | None = field(default=None, repr=False)

    @property
    def quiet(self) -> bool:
        """A recording's run that is neither the block's first nor checkpointed (``Probe.quiet``)."""
        return not (self.replay or self.note or self.first)

    @property
    def given(self) -> set[int]:
        """Ids of the objects ``end()`` was given and of those one container deep: found when a
        probe first asks (most runs without a checkpoint never do)."""
        if self._given is None:
            self._given = given_ids(self.objs)
        return self._given

    @property
    def variables(self) -> dict[str, Any]:
        """The frame's variables, its locals over its module's globals: read once at ``enter``
        and once at ``end()``, for every probe."""
        if self._variables is None:
            self._variables = frame_variables(self.frame)
        return self._variables


class Probe:
    """What every probe may do; each verb does nothing unless a probe overrides it."""

    #: the verbs that do something at a recording's block run that is neither the block's first
    #: nor checkpointed (``View.first``, ``View.note``): the others are not called there, so a loop
    #: of short block runs (docs/loops.md) pays only for these
    quiet: frozenset[str] = frozenset({"enter", "leave"})
    #: of those, the verbs that still act at a quiet run once the block has ended twice (a "steady"
    #: run: its first and second runs are over); None: the same as ``quiet``. A steady run calls
    #: only these, with a view it reuses (no frame, ``first``/``note``/``replay`` False), and is
    #: timed as a whole (``Watch.steady_s``): a block per iteration pays just them
    steady: frozenset[str] | None = None

    def enter(self, view: View, say: Say) -> None:
        """At ``step_into``."""

    def leave(self, view: View, say: Say) -> None:
        """At ``end()`` while recording: add what to note to ``view.noted``."""

    def restore(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        """At ``end()`` of a restored block: set what ``noted`` holds; the names left as they were."""
        return []

    def check(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        """At ``step_into`` while replaying: compare with what the recording noted; what differs."""
        return []

    def compare(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        """At ``end()`` of a re-executed block: what differs from what the recording's run noted."""
        return []


class Watch:
    """The probes of a session, run in order; never raises into the script."""

    def __init__(self, probes: Iterable[Probe], say: Say, *, replay: bool = False) -> None:
        self.probes = list(probes)
        self.replay = replay
        self._say = say
        self.seconds = 0.0  # in the probes, all verbs together: charged to the overhead budget
        self.failed: dict[str, str] = {}  # probe -> its first exception, for run.json
        self.by_probe: dict[str, float] = {}  # probe -> its seconds, all verbs (run.json timings.watch_probes_s)
        self.steady_s = 0.0  # ... but in steady runs (Probe.steady), all probes together
        self._steady_runs = 0  # steady verb calls so far: one in STEADY_TIMED is timed (``_run_steady``)
        self._steady_recent: deque[float] = deque(maxlen=255)  # the last timed ones, for ``steady_run_s``
        self._entered: set[str] = set()  # blocks entered at least once
        self._open: View | None = None
        self._ends: dict[str, int] = {}  # block -> its runs that reached leave()
        self._settled: set[str] = set()  # recording: blocks ended twice, whose quiet runs are steady (Probe.steady)
        self._steady = View("", None, 0, None, first=False, note=False)  # the view every steady run reuses

    @property
    def probes(self) -> list[Probe]:
        return self._probes

    @probes.setter
    def probes(self, probes: list[Probe]) -> None:
        self._probes = probes
        #: verb -> (probe's name, its method) of the probes that do something there, in order; "quiet
        #: enter" and "quiet leave": of those, the ones a quiet run calls (``Probe.quiet``)
        self._verbs: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        for verb in ("enter", "leave", "restore", "check", "compare"):
            acting = [probe for probe in probes
                      if getattr(getattr(probe, verb), "__func__", None) is not getattr(Probe, verb)]
            self._verbs[verb] = [(type(probe).__name__, getattr(probe, verb)) for probe in acting]
            self._verbs[f"quiet {verb}"] = [(type(probe).__name__, getattr(probe, verb)) for probe in acting
                                            if verb in probe.quiet]
            self._verbs[f"steady {verb}"] = [(type(probe).__name__, getattr(probe, verb)) for probe in acting
                                             if verb in (probe.quiet if probe.steady is None else probe.steady)]
        self._steady_enter, self._steady_leave = self._verbs["steady enter"], self._verbs["steady leave"]

    def enter(self, block: str, epoch: int | None, occ: int, frame: FrameType | None,
              noted: dict[str, Any] | None = None, *, note: bool = True) -> list[str]:
        """``step_into``: every probe's ``enter``; while replaying (``noted``: what the recording
        noted for this run, or {}) every probe's ``check`` too, and what they found differs.
        ``note``: whether this run's state is noted (a recording notes the runs it checkpoints)."""
        view = self._open = View(block, epoch, occ, frame, first=block not in self._entered, replay=self.replay,
                                 note=note)
        self._entered.add(block)
        self._each("quiet enter" if view.quiet else "enter", view)
        if noted is None:
            return []
        return sorted({name for found in self._each("check", view, noted) for name in found or ()})

    def leave(self, frame: FrameType | None, objs: tuple, restored: dict[str, Any] | None = None,
              compared: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
        """``end()``: while replaying a block it restored (``restored``: what the recording noted for
        this run), every probe's ``restore`` first; of a block it re-executed where the recording's
        run has a checkpoint (``compared``: what that run noted), every probe's ``compare``; then
        every probe's ``leave``. What the probes noted, and the names a restore left as they were
        or a compare found different."""
        view = self._ended(frame, objs)
        if view is None:
            return {}, []
        found: list[str] = []
        for verb, noted in (("restore", restored), ("compare", compared)):
            if noted is not None:
                for names in self._each(verb, view, noted):
                    found += names or []
        self._each("quiet leave" if view.quiet else "leave", view)
        ends = self._ends[view.block] = self._ends.get(view.block, 0) + 1
        if ends >= 2 and not self.replay:
            self._settled.add(view.block)
        return view.noted, sorted(set(found))

    def steady_enter(self, block: str, epoch: int | None, occ: int) -> bool:
        """``step_into`` of a recording's quiet run (neither the block's first nor checkpointed):
        where the block has ended twice, only the verbs that still act there (``Probe.steady``),
        with the one view steady runs reuse, and True; else False (nothing done: call ``enter``)."""
        if block not in self._settled:
            return False
        view = self._open = self._steady
        view.block, view.epoch, view.occ = block, epoch, occ
        self._run_steady(self._steady_enter, view)
        return True

    def steady_leave(self, objs: tuple) -> dict[str, Any] | None:
        """``end()`` of a run ``steady_enter`` opened: its steady verbs, and what they noted (None
        where the open run is not steady: call ``leave``)."""
        view = self._open
        if view is not self._steady:
            return None
        self._open = None
        view.objs = objs
        if view.noted:
            view.noted.clear()
        self._run_steady(self._steady_leave, view)
        return view.noted

    def _run_steady(self, verbs: list[tuple[str, Callable[..., Any]]], view: View) -> None:
        """``_each`` for a steady run: its verbs, one of every ``STEADY_TIMED`` timed as a whole and
        counted that many times (the same verbs on the same objects: the clocks were a tenth of a
        block per iteration's flor time)."""
        say = self._say
        self._steady_runs = n = self._steady_runs + 1
        t0 = time.perf_counter() if n % STEADY_TIMED == 1 else 0.0
        for kind, method in verbs:
            try:
                method(view, say)
            except Exception as exc:  # noqa: BLE001 - as in _each: a probe only advises
                self.failed.setdefault(kind, repr(exc)[:300])
        if t0:
            took = time.perf_counter() - t0
            self._steady_recent.append(took)
            spent = took * STEADY_TIMED
            self.seconds += spent
            self.steady_s += spent

    @property
    def steady_runs(self) -> int:
        """Block runs that were steady (each calls its steady verbs twice: at enter and at leave)."""
        return self._steady_runs // 2

    @property
    def steady_run_s(self) -> float:
        """The steady verbs' seconds a block run: twice the median of the last timed calls (a
        preempted or paging call, counted ``STEADY_TIMED`` times in ``steady_s``, does not move it)."""
        recent = sorted(self._steady_recent)
        return 2 * recent[len(recent) // 2] if recent else 0.0

    def drop(self) -> None:
        """The open block closed without ``end()`` (an exception, ``continue``)."""
        self._open = None

    def _ended(self, frame: FrameType | None, objs: tuple) -> View | None:
        view, self._open = self._open, None
        if view is not None:
            view.frame, view.objs, view._variables, view._given = frame, objs, None, None  # read again at end()
        return view

    def say(self, code: str, subject: Any, text: str) -> None:
        self._say(code, subject, text)

    def _each(self, verb: str, view: View, *args: Any) -> list[Any]:
        out = []
        say, by_probe, clock = self._say, self.by_probe, time.perf_counter
        t0 = last = clock()
        for kind, method in self._verbs[verb]:
            try:
                out.append(method(view, *args, say))
            except Exception as exc:  # noqa: BLE001 - the one never-raise wrapper: a probe only advises
                self.failed.setdefault(kind, repr(exc)[:300])
            now = clock()
            by_probe[kind] = by_probe.get(kind, 0.0) + now - last
            last = now
        self.seconds += last - t0
        return out
