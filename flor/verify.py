"""What a replay checks about itself, and the summary it prints at the end.

A replay compares (1) the state of every block it executed with the digest recorded for
that block and epoch, and (2) every value logged under the same name, epoch and step in
both the recording and the replay. The summary ends with one verdict line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from ._fmt import listed
from .findings import code_of

__all__ = ["BlockEvent", "CAUSE_CODE", "CAUSE_NONDET", "CAUSE_NOT_PASSED", "CAUSE_RNG", "CAUSE_THREADS", "CONDITIONS",
           "Summary", "cause_missing", "compare_logs"]

#: the findings that make a value differ from a full re-execution of the edited script (or be
#: missing): a replay that notes one is not "verified exact", whatever it checked. Each is named
#: with its code in the verdict line and ``summary.json`` (``conditions``), and the replay exits 3
#: (1 where only values could not be written) unless --flor_lenient.
CONDITIONS: dict[str, str] = {
    "FL201": "an LR scheduler or GradScaler end() is not given was not restored",
    "FL204": "a name the block assigns and later code reads was not restored",
    "FL322": "outer-loop variables were not restored",
    "FL325": "hindsight code drew from a global random generator",
    "FL328": "code outside the blocks changed the model, unlike the recording",
    "FL330": "logged values could not be written",
    "FL336": "a value a block carries into its next run was not restored",
    "FL337": "variables a block changes outside end() could not be set",
    "FL338": "a hindsight flor.log never ran",
}

CAUSE_NOT_PASSED = "an object changed inside the block was not passed to end()"
CAUSE_CODE = "the training code changed since the recording (the edit touches more than logging)"
CAUSE_RNG = "the block now draws a different amount of randomness (added code that uses random numbers?)"
CAUSE_THREADS = "the torch thread count differs from the recording"
CAUSE_NONDET = ("nondeterminism in the training code (non-deterministic kernels, DataLoader workers, "
                "time- or environment-dependent code)")


@dataclass
class BlockEvent:
    epoch: int | None
    block: str
    occurrence: int
    action: str  # restored | matched | diverged | executed (no checkpoint)
    initializing: bool = False
    tensors: list[str] = field(default_factory=list)
    cause: str | None = None


def never_ran(log: str, where: str) -> str:
    """FL338's note: the hindsight ``log`` (its call and where it sits) never ran ``where``.

    >>> never_ran("flor.log('x', ...) at line 3, in f()", "in this replay")[:70]
    "the hindsight flor.log('x', ...) at line 3, in f() never ran in this r"
    """
    return (f"the hindsight {log} never ran {where}, so its values are missing; move it where the replayed "
            "code runs (inside a block, or after end()) or pass probed=True to the block that runs it")


def cause_missing(names: list[str]) -> str:
    """The likely cause of a divergence where the replay knows it did not restore ``names``."""
    return f"state this replay could not restore as recorded: {listed(sorted(names), 6)} (see the notes)"


def compare_logs(recorded: list[dict], replayed: list[dict], *, key: Callable[[dict], Any],
                 same: Callable[[Any, Any], bool]) -> tuple[int, list[dict], list[str]]:
    """(shared count, mismatches, hindsight names) between one worker's records and the recording's.

    ``key`` and ``same`` are ``flor.logs.record_key`` and ``flor.logs.same_value`` (passed in:
    this module sits above the logs layer)."""
    base = {key(r): r for r in recorded}
    shared, bad, hindsight = 0, [], set()
    for r in replayed:
        old = base.get(key(r))
        if old is None:
            hindsight.add(r["name"])
            continue
        shared += 1
        if not same(old["value"], r["value"]):
            bad.append({"name": r["name"], "epoch": r.get("epoch"), "step": r.get("step"),
                        "recorded": old["value"], "replayed": r["value"]})
    return shared, bad, sorted(hindsight)


def _ranges(epochs: list[int]) -> str:
    out: list[str] = []
    start: int | None = None
    prev = 0  # read only once start is set
    for e in sorted(epochs):
        if start is None:
            start = prev = e
        elif e == prev + 1:
            prev = e
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = e
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(out) or "-"


@dataclass
class Summary:
    """Collects a replay worker's events and renders the verification report."""

    header: str
    events: list[BlockEvent] = field(default_factory=list)
    shared_logs: int = 0
    log_mismatches: list[dict] = field(default_factory=list)
    hindsight: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log_cause: str | None = None
    failed: str | None = None  # the exception that ended the script, if any
    loop: list[str] = field(default_factory=list)  # the loop itself diverged (stopped at another epoch)
    lenient: bool = False  # --flor_lenient: a divergence exits 0, not 3
    #: state the replay knows it did not set as a full run has it (named in the notes): a verdict
    #: of exact covers what was checked, not values read from these
    unrestored: list[str] = field(default_factory=list)
    #: tensors code outside the blocks changed in place where the recorded script did not (a
    #: hindsight line that trains): a full run of this script trains otherwise from there
    outside: list[str] = field(default_factory=list)
    #: files this worker wrote that the recording wrote too (FL340): a launch names those several wrote
    rewrote: list[str] = field(default_factory=list)
    #: a worker of a launch that replays every epoch: the hindsight flor.log calls the edit added, as
    #: [name, where], and the names of those that ran here: a launch names those that ran in no worker (FL338)
    new_logs: list[list[str]] = field(default_factory=list)
    ran_new: list[str] = field(default_factory=list)

    def check_logs(self, recorded: list[dict], replayed: list[dict], *, key: Callable[[dict], Any],
                   same: Callable[[Any, Any], bool], code_changed: bool) -> None:
        """Compare the values both the recording and this replay logged (``compare_logs``) and, where
        some differ, name the likely cause."""
        self.shared_logs, self.log_mismatches, self.hindsight = compare_logs(recorded, replayed, key=key, same=same)
        if not self.log_mismatches:
            return
        if any(e.action == "diverged" for e in self.events):
            self.log_cause = "it follows from the diverged blocks above"
        elif self.unrestored:  # what flor knows is missing comes before blaming the edit
            self.log_cause = cause_missing(self.unrestored)
        elif code_changed:
            self.log_cause = CAUSE_CODE
        else:
            self.log_cause = ("code outside the blocks depends on state that was not passed to end(), "
                              "or on randomness drawn inside a block")

    @property
    def conditions(self) -> list[str]:
        """The codes of ``CONDITIONS`` among the notes, in the order first noted."""
        out: list[str] = []
        for code in map(code_of, self.notes):
            if code in CONDITIONS and code not in out:
                out.append(code)
        if self.unrestored and not {"FL201", "FL204", "FL322", "FL336", "FL337"} & set(out):
            out.append("FL337")  # named by no note: still not exact
        if self.outside and "FL328" not in out:
            out.append("FL328")
        return out

    @property
    def exit_status(self) -> int:
        """0, or what a replay that is not exact exits with: 3, or 1 where the only condition is
        that values could not be written (replay again to keep them)."""
        if self.failed or self.lenient:
            return 0
        if self.diverged:
            return 3
        conditions = self.conditions
        return 0 if not conditions else 1 if conditions == ["FL330"] else 3

    @property
    def diverged(self) -> bool:
        return any(e.action == "diverged" for e in self.events) or bool(self.log_mismatches) or bool(self.loop)

    @property
    def checked_nothing(self) -> bool:
        """No block was restored or compared and no value was logged in both record and replay
        (a recording with no epoch, or a worker whose segment is empty): nothing to call exact."""
        c = self.counts()
        return not (c["restored"] or c["matched"] or c["diverged"] or self.shared_logs)

    def counts(self) -> dict[str, int]:
        out = {"restored": 0, "matched": 0, "diverged": 0, "executed": 0}
        for e in self.events:
            if not e.initializing:
                out[e.action.split()[0]] += 1
        return out

    def to_json(self) -> dict:
        conditions = self.conditions
        return {
            "verdict": "failed" if self.failed else "diverged" if self.diverged else "not exact" if conditions
            else "checked nothing" if self.checked_nothing else "verified exact",
            "conditions": [{"code": c, "what": CONDITIONS[c],
                            "notes": [n for n in self.notes if code_of(n) == c][:8]} for c in conditions],
            "counts": self.counts(), "shared_logs": self.shared_logs,
            "log_mismatches": self.log_mismatches[:100], "hindsight": self.hindsight, "notes": self.notes,
            "findings": sorted({c for c in map(code_of, self.notes) if c is not None}),
            "loop": self.loop, "unrestored": self.unrestored, "outside": self.outside, "rewrote": self.rewrote,
            **({"new_logs": self.new_logs, "ran_new": self.ran_new} if self.new_logs else {}),
            "blocks": [e.__dict__ for e in self.events],
        }

    def render(self, *, shown: Collection[str] = ()) -> str:
        """The report; notes in ``shown`` (already printed as they came) are not repeated."""
        lines = [self.header]
        groups: dict[tuple, list[int]] = {}
        for e in self.events:
            label = e.action + (" (initialization)" if e.initializing else "")
            groups.setdefault((e.block, label), []).append(-1 if e.epoch is None else e.epoch)
        for (block, label), epochs in groups.items():
            where = "outside the loop" if epochs == [-1] else f"epochs {_ranges([x for x in epochs if x >= 0])}"
            lines.append(f"  {block}: {label}: {where}")
        for e in self.events:
            if e.action == "diverged":
                lines.append(f"  DIVERGED at epoch {e.epoch}, block {e.block!r}: {listed(e.tensors, 8)}; "
                             f"likely cause: {e.cause}")
        lines.append(f"  logs: {self.shared_logs} values logged in both record and replay, "
                     f"{self.shared_logs - len(self.log_mismatches)} equal"
                     + (f"; hindsight values: {', '.join(self.hindsight)}" if self.hindsight else ""))
        for m in self.log_mismatches[:10]:
            lines.append(f"  DIVERGED log {m['name']!r} at epoch {m['epoch']}, step {m['step']}: "
                         f"recorded {m['recorded']!r}, replayed {m['replayed']!r}"
                         + (f"; likely cause: {self.log_cause}" if self.log_cause else ""))
        if len(self.log_mismatches) > 10:
            lines.append(f"  ... and {len(self.log_mismatches) - 10} more log values differ")
        lines.extend(f"  DIVERGED {text}" for text in self.loop)
        lines.extend(f"  note: {n}" for n in self.notes if n not in shown)
        c = self.counts()
        blocks = f"{c['restored']} blocks restored, {c['matched'] + c['diverged']} executed and checked " \
                 f"({c['diverged']} diverged), {c['executed']} re-executed without a checkpoint"
        logs = f"{self.shared_logs - len(self.log_mismatches)}/{self.shared_logs} shared log values equal"
        if self.failed:
            lines.append(f"flor: replay FAILED ({self.failed}) before it finished: {blocks}; {logs}")
        elif self.diverged:
            status = "exit status 0 (--flor_lenient)" if self.lenient else "exit status 3 (--flor_lenient keeps 0)"
            lines.append(f"flor: replay DIVERGED: {blocks}; {logs}; {status}")
        elif self.conditions:
            status = "exit status 0 (--flor_lenient)" if self.lenient else \
                f"exit status {self.exit_status} (--flor_lenient keeps 0)"
            named = "; ".join(f"{c} {CONDITIONS[c]}" for c in self.conditions)
            lines.append(f"flor: replay NOT EXACT: {blocks}; {logs}; {named}" + (
                f"; not restored: {listed(self.unrestored, 8)}" if self.unrestored else "") + (
                f"; changed outside the blocks, unlike the recording: {listed(self.outside, 2)}" if self.outside
                else "") + f" (values may differ from a full re-execution: see the notes); {status}")
        elif self.checked_nothing:
            lines.append(f"flor: replay checked nothing: {blocks}; {logs} (no block was restored or checked "
                         "and no value logged in both record and replay: `flor show NAME` lists what the run "
                         "recorded)")
        else:
            lines.append(f"flor: replay verified exact: {blocks}; {logs}")
        return "\n".join(lines)
