"""Which edits of a script are logging only: what a replay compares with the recorded script,
and what a sweep moves into an older version (``flor.source.transplant``).

Calls made for what they print or record, never for what they compute, are logging:
``flor.log``, ``print``, ``logging`` and logger methods, tqdm's display methods, trackers'
``log_*``/``add_scalar*``; so are assignments whose names only such calls read.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["assigned", "dotted", "flor_log_value", "is_logging_call", "logging_only_names", "non_logging_changes"]

# What counts as logging when a replay compares the script with the recorded one: calls made
# for what they print or record, never for what they compute.
# What counts as logging when a replay compares the script with the recorded one: calls made
# for what they print or record, never for what they compute.
_PRINT_NAMES = {"print", "log"}  # print(...); log(...) as in `from flor import log`



_LOG_LEVELS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log"}  # logging, loggers



_DISPLAY_METHODS = {"set_postfix", "set_postfix_str", "set_description", "set_description_str", "write"}  # tqdm



_TRACKER_PREFIXES = ("log_", "add_scalar")  # mlflow.log_metric, SummaryWriter.add_scalar(s)



def dotted(node: ast.AST) -> str:
    """``self.logger.info`` -> ``"self.logger.info"``; anything else that is not a name -> ``""``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])



def is_logging_call(call: ast.AST) -> bool:
    """``print``, ``flor.log``, ``logging.info``/``logger.warning``/``self.log.debug``, tqdm's
    ``write``/``set_postfix``, ``wandb.log``, ``mlflow.log_metric``, ``writer.add_scalar``."""
    if not isinstance(call, ast.Call):
        return False
    fn = call.func
    if isinstance(fn, ast.Name):
        return fn.id in _PRINT_NAMES
    if not isinstance(fn, ast.Attribute):
        return False
    owner = dotted(fn.value).rsplit(".", 1)[-1].lower()
    if fn.attr == "log" or fn.attr.startswith(_TRACKER_PREFIXES):
        return owner not in ("torch", "np", "numpy", "math", "F", "tensor") and bool(owner)
    if fn.attr in _LOG_LEVELS:
        return "log" in owner  # logging, logger, log, LOGGER, self.logger
    if fn.attr in _DISPLAY_METHODS:
        return owner in ("tqdm", "pbar", "bar", "progress") or "tqdm" in owner or "bar" in owner
    return False



def flor_log_value(call: ast.Call) -> ast.AST | None:
    """The value of ``flor.log(name, value, ...)``, which returns it: ``x = flor.log("x", f())`` is ``x = f()``."""
    if dotted(call.func) in ("flor.log", "log") and len(call.args) >= 2:
        return call.args[1]
    return None



def _loaded(nodes: list[ast.AST]) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}



def assigned(stmt: ast.stmt) -> set[str] | None:
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

    def __init__(self, drop: set[str] | frozenset[str] = frozenset(), *, keep_calls: bool = False) -> None:
        self.drop = drop  # names assigned only for logging (found by an earlier pass)
        self.removed: list[ast.AST] = []
        #: an assignment of a call's result to a name only logging reads keeps the call
        #: (``gn = clip_grad_norm_(...)`` where the recording called ``clip_grad_norm_(...)``)
        self.keep_calls = keep_calls

    def visit_Expr(self, node: ast.Expr) -> Any:
        if is_logging_call(node.value):
            self.removed.append(node)
            return None
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> Any:
        node.keywords = [k for k in node.keywords if k.arg != "probed"]
        value = flor_log_value(node)
        if value is not None:  # keep what it computes, drop what it logs
            self.removed.append(node)
            return self.visit(value)
        return self.generic_visit(node)

    def _assignment(self, node: ast.stmt) -> Any:
        names = assigned(node)
        if names and names <= self.drop:
            self.removed.append(node)
            value = getattr(node, "value", None)
            if self.keep_calls and isinstance(node, ast.Assign) and isinstance(value, ast.Call):
                return self.visit(ast.Expr(value))
            return None
        return self.generic_visit(node)

    visit_Assign = visit_AnnAssign = visit_AugAssign = visit_Import = visit_ImportFrom = _assignment

    def _function(self, node: Any) -> Any:
        """A function only logging calls (``def grad_norm(model): ...`` for a ``flor.log``) goes too."""
        if node.name in self.drop:
            self.removed.append(node)
            return None
        return self.generic_visit(node)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

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



def logging_only_names(tree: ast.Module) -> set[str]:
    """Names assigned only to be logged: read by logging code and by nothing else, to a fixed
    point (a value computed for a log, then one computed from it...)."""
    drop: set[str] = set()
    while True:
        stripper = _StripLogging(drop)
        kept = stripper.visit(_copy(tree))
        feeds_logs = _loaded(stripper.removed) - _loaded([kept])
        more = {n for node in ast.walk(kept) if isinstance(node, ast.stmt)
                for n in (assigned(node) or ()) if n in feeds_logs}
        more |= {node.name for node in ast.walk(kept) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.name in feeds_logs and not node.decorator_list}
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
    >>> non_logging_changes("clip(p)", "gn = clip(p)\\nflor.log('gn', gn)")  # the recording's call, its result kept
    False
    >>> non_logging_changes("x = f()", "def norm(v):\\n    return v.norm()\\nx = f()\\nflor.log('n', norm(x))")
    False
    >>> non_logging_changes("x = f()", "x = g()")
    True
    """
    try:
        a, b = ast.parse(recorded), ast.parse(current)
    except SyntaxError:
        return recorded != current
    # one set for both: a value that only feeds a log in one version goes in the other one too
    drop = logging_only_names(a) | logging_only_names(b)
    if ast.dump(_StripLogging(drop).visit(_copy(a))) == ast.dump(_StripLogging(drop).visit(_copy(b))):
        return False
    # a call whose result the edit keeps for a log: the call stays, as the recording made it
    keep = [ast.dump(_StripLogging(drop, keep_calls=True).visit(t)) for t in (a, b)]
    return keep[0] != keep[1]
