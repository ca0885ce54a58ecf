"""What a replay checks about itself, and the summary it prints at the end.

A replay compares (1) the state of every block it executed with the digest recorded for
that block and epoch, and (2) every value logged under the same name, epoch and step in
both the recording and the replay. The summary ends with one verdict line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from ._fmt import listed

__all__ = ["BlockEvent", "Summary", "compare_logs", "non_logging_changes"]

CAUSE_NOT_PASSED = "an object changed inside the block was not passed to end()"
CAUSE_CODE = "the training code changed since the recording (the edit touches more than logging)"
CAUSE_RNG = "the block now draws a different amount of randomness (added code that uses random numbers?)"
CAUSE_THREADS = "the torch thread count differs from the recording"
CAUSE_NONDET = "nondeterminism in the training code (non-deterministic kernels, DataLoader workers, time- or environment-dependent code)"

# What counts as logging when a replay compares the script with the recorded one: calls made
# for what they print or record, never for what they compute.
_PRINT_NAMES = {"print", "log"}  # print(...); log(...) as in `from flor import log`
_LOG_LEVELS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log"}  # logging, loggers
_DISPLAY_METHODS = {"set_postfix", "set_postfix_str", "set_description", "set_description_str", "write"}  # tqdm
_TRACKER_PREFIXES = ("log_", "add_scalar")  # mlflow.log_metric, SummaryWriter.add_scalar(s)


def _dotted(node: ast.AST) -> str:
    """``self.logger.info`` -> ``"self.logger.info"``; anything else that is not a name -> ``""``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def _is_logging_call(call: ast.AST) -> bool:
    """``print``, ``flor.log``, ``logging.info``/``logger.warning``/``self.log.debug``, tqdm's
    ``write``/``set_postfix``, ``wandb.log``, ``mlflow.log_metric``, ``writer.add_scalar``."""
    if not isinstance(call, ast.Call):
        return False
    fn = call.func
    if isinstance(fn, ast.Name):
        return fn.id in _PRINT_NAMES
    if not isinstance(fn, ast.Attribute):
        return False
    owner = _dotted(fn.value).rsplit(".", 1)[-1].lower()
    if fn.attr == "log" or fn.attr.startswith(_TRACKER_PREFIXES):
        return owner not in ("torch", "np", "numpy", "math", "F", "tensor") and bool(owner)
    if fn.attr in _LOG_LEVELS:
        return "log" in owner  # logging, logger, log, LOGGER, self.logger
    if fn.attr in _DISPLAY_METHODS:
        return owner in ("tqdm", "pbar", "bar", "progress") or "tqdm" in owner or "bar" in owner
    return False


def _flor_log_value(call: ast.Call) -> ast.AST | None:
    """The value of ``flor.log(name, value, ...)``, which returns it: ``x = flor.log("x", f())`` is ``x = f()``."""
    if _dotted(call.func) in ("flor.log", "log") and len(call.args) >= 2:
        return call.args[1]
    return None


def _loaded(nodes: list[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _assigned(stmt: ast.stmt) -> set[str] | None:
    """The names a plain assignment or an import binds (``a = ...``, ``a, b = ...``, ``a: T = ...``,
    ``a += ...``, ``import logging``); None for anything else (attributes, subscripts: those change objects)."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        if any(a.name == "*" for a in stmt.names):
            return None
        return {a.asname or a.name.split(".")[0] for a in stmt.names}
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
        if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else None
    if not targets:
        return None
    names: set[str] = set()
    for t in targets:
        for n in ast.walk(t):
            if isinstance(n, (ast.Attribute, ast.Subscript, ast.Starred)):
                return None
            if isinstance(n, ast.Name):
                names.add(n.id)
    return names


class _StripLogging(ast.NodeTransformer):
    """Drop logging statements and ``probed=`` arguments: what remains is the training code.

    ``removed`` collects the dropped logging code, so that assignments feeding only it can go too.
    """

    def __init__(self, drop: set[str] | frozenset[str] = frozenset()) -> None:
        self.drop = drop  # names assigned only for logging (found by an earlier pass)
        self.removed: list[ast.AST] = []

    def visit_Expr(self, node: ast.Expr) -> Any:
        if _is_logging_call(node.value):
            self.removed.append(node)
            return None
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> Any:
        node.keywords = [k for k in node.keywords if k.arg != "probed"]
        value = _flor_log_value(node)
        if value is not None:  # keep what it computes, drop what it logs
            self.removed.append(node)
            return self.visit(value)
        return self.generic_visit(node)

    def _assignment(self, node: ast.stmt) -> Any:
        names = _assigned(node)
        if names and names <= self.drop:
            self.removed.append(node)
            return None
        return self.generic_visit(node)

    visit_Assign = visit_AnnAssign = visit_AugAssign = visit_Import = visit_ImportFrom = _assignment

    def _compound(self, node: Any) -> Any:
        """An ``if``/``with``/``for`` whose body was all logging goes with it."""
        self.generic_visit(node)
        if not node.body and not getattr(node, "orelse", None):
            self.removed.append(node)
            return None
        if not node.body:
            node.body = [ast.Pass()]
        return node

    visit_If = visit_With = visit_For = _compound


def _logging_only_names(tree: ast.Module) -> set[str]:
    """Names assigned only to be logged: read by logging code and by nothing else, to a fixed
    point (a value computed for a log, then one computed from it...)."""
    drop: set[str] = set()
    while True:
        stripper = _StripLogging(drop)
        kept = stripper.visit(_copy(tree))
        feeds_logs = _loaded(stripper.removed) - _loaded([kept])
        more = {n for node in ast.walk(kept) if isinstance(node, ast.stmt)
                for n in (_assigned(node) or ()) if n in feeds_logs}
        if more <= drop:
            return drop
        drop |= more


def _copy(tree: ast.Module) -> ast.Module:
    return ast.parse(ast.unparse(tree))


def non_logging_changes(recorded: str, current: str) -> bool:
    """True when ``current`` differs from ``recorded`` by more than logging: ``print``,
    ``flor.log`` (its value stays), ``logging``/logger calls, tqdm's ``write``/``set_postfix``,
    tracker calls (``wandb.log``, ``mlflow.log_metric``, ``writer.add_scalar``), ``probed=``
    flags, and assignments to names that only those calls read.

    >>> non_logging_changes("x = f()", "x = f()\\ngn = norm(x)\\nprint(gn)")
    False
    >>> non_logging_changes("x = f()", "x = g()")
    True
    """
    try:
        a, b = ast.parse(recorded), ast.parse(current)
    except SyntaxError:
        return recorded != current
    # one set for both: a value that only feeds a log in one version goes in the other one too
    drop = _logging_only_names(a) | _logging_only_names(b)
    return ast.dump(_StripLogging(drop).visit(a)) != ast.dump(_StripLogging(drop).visit(b))


@dataclass
class BlockEvent:
    epoch: int | None
    block: str
    occurrence: int
    action: str  # restored | matched | diverged | executed (no checkpoint)
    initializing: bool = False
    tensors: list[str] = field(default_factory=list)
    cause: str | None = None


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
    out, start, prev = [], None, None
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
        return {
            "verdict": "failed" if self.failed else "diverged" if self.diverged
            else "checked nothing" if self.checked_nothing else "verified exact",
            "counts": self.counts(), "shared_logs": self.shared_logs,
            "log_mismatches": self.log_mismatches[:100], "hindsight": self.hindsight, "notes": self.notes,
            "loop": self.loop, "unrestored": self.unrestored, "outside": self.outside,
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
        elif self.checked_nothing:
            lines.append(f"flor: replay checked nothing: {blocks}; {logs} (no block was restored or checked "
                         "and no value logged in both record and replay: `flor show NAME` lists what the run "
                         "recorded)")
        else:
            lines.append(f"flor: replay verified exact: {blocks}; {logs}" + (
                f"; not restored: {listed(self.unrestored, 8)} (values read from them may differ from a full "
                "re-execution: see the notes)" if self.unrestored else "") + (
                f"; changed outside the blocks, unlike the recording: {listed(self.outside, 2)} (a full run of this "
                "script trains otherwise from there: see the notes)" if self.outside else ""))
        return "\n".join(lines)
