"""Which edits of a script are logging only: what a replay compares with the recorded script,
and what a sweep moves into an older version (``flor.source.transplant``).

Calls made for what they print or record, never for what they compute, are logging:
``flor.log``, ``print``, ``logging`` and logger methods, tqdm's display methods, trackers'
``log_*``/``add_scalar*``; so are assignments whose names only such calls read.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["assigned", "containers", "dotted", "flor_log_value", "is_logging_call", "logging_only_names",
           "metric_functions", "non_logging_changes"]

# What counts as logging when a replay compares the script with the recorded one: calls made
# for what they print or record, never for what they compute.
_PRINT_NAMES = {"print", "log"}  # print(...); log(...) as in `from flor import log`
_LOG_LEVELS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log"}  # logging, loggers
_DISPLAY_METHODS = {"set_postfix", "set_postfix_str", "set_description", "set_description_str", "write"}  # tqdm
_TRACKER_PREFIXES = ("log_", "add_scalar")  # mlflow.log_metric, SummaryWriter.add_scalar(s)

#: keyword arguments that take a function whose result only feeds logs: the Hugging Face Trainer's
#: ``compute_metrics`` (its dict becomes the ``eval_*`` values the Trainer logs, which
#: flor.integrations.transformers keeps). Early stopping and ``metric_for_best_model`` read one
#: entry by the name the Trainer's arguments give: an edit of those arguments is not logging.
_METRIC_FUNCTIONS = {"compute_metrics"}

#: methods that add to a dict or list: ``metrics.update(...)``, ``row.append(...)``
_ADDERS = {"update", "append", "extend", "insert", "setdefault"}


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


def _loaded(nodes: list[ast.AST], containers: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """The names ``nodes`` read; a container of ``containers`` is not read where entries are only
    added to it (``metrics["acc"] = ...``): that statement goes with the container when only logs read it."""
    adding = {id(receiver) for node in nodes for stmt in ast.walk(node) if isinstance(stmt, ast.stmt)
              for receiver in [_adds_to(stmt, containers)] if receiver is not None}
    return {n.id for node in nodes for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in adding}


def metric_functions(tree: ast.AST) -> set[str]:
    """The script's functions whose result only feeds logs: those it passes as ``compute_metrics=``
    (``Trainer(..., compute_metrics=compute_metrics)``), by name."""
    out: set[str] = set()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call):
            for k in call.keywords:
                if k.arg in _METRIC_FUNCTIONS and isinstance(k.value, (ast.Name, ast.Attribute)):
                    out.add(k.value.id if isinstance(k.value, ast.Name) else k.value.attr)
    return out


def _fresh(value: ast.AST | None) -> bool:
    """A new dict, list or set: a display, a comprehension, or ``dict(...)``/``list(...)``/``set(...)``."""
    if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
        return True
    return isinstance(value, ast.Call) and dotted(value.func) in ("dict", "list", "set")


def containers(tree: ast.AST) -> set[str]:
    """Names the script binds only to a new dict, list or set (``metrics = {}``): adding entries to
    one changes no other object, so where only logs read it, adding to it is logging too."""
    fresh: set[int] = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) and node.value is not None else []
        if targets and _fresh(getattr(node, "value", None)):
            fresh.update(id(t) for t in targets if isinstance(t, ast.Name))
    good: set[str] = set()
    bad: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            (good if id(node) in fresh else bad).add(node.id)
        elif isinstance(node, ast.arg):
            bad.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bad.update(node.names)
    return good - bad


def _adds_to(stmt: ast.stmt, names: set[str] | frozenset[str]) -> ast.Name | None:
    """The container of ``names`` that ``stmt`` only adds entries to (``m["k"] = v``,
    ``m.update(...)``, ``m.append(...)``), or None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and target.value.id in names:
            return target.value
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        fn = stmt.value.func
        if isinstance(fn, ast.Attribute) and fn.attr in _ADDERS and isinstance(fn.value, ast.Name) \
                and fn.value.id in names:
            return fn.value
    return None


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

    def __init__(self, drop: set[str] | frozenset[str] = frozenset(), *, keep_calls: bool = False,
                 containers: set[str] | frozenset[str] = frozenset(),
                 metrics: set[str] | frozenset[str] = frozenset()) -> None:
        self.drop = drop  # names assigned only for logging (found by an earlier pass)
        self.removed: list[ast.AST] = []
        #: an assignment of a call's result to a name only logging reads keeps the call
        #: (``gn = clip_grad_norm_(...)`` where the recording called ``clip_grad_norm_(...)``)
        self.keep_calls = keep_calls
        #: dicts, lists and sets of the script only logging reads: adding entries to them is logging
        self.adds = frozenset(drop) & frozenset(containers)
        self.metrics = metrics  # functions whose result only feeds logs (metric_functions): their returns log
        self._functions: list[str] = []

    def visit_Expr(self, node: ast.Expr) -> Any:
        if is_logging_call(node.value) or _adds_to(node, self.adds) is not None:
            self.removed.append(node)
            return None
        return self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> Any:
        if node.value is not None and self._functions and self._functions[-1] in self.metrics:
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
        if _adds_to(node, self.adds) is not None:  # metrics["acc"] = ... where only logs read metrics
            self.removed.append(node)
            return None
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
        self._functions.append(node.name)
        self.generic_visit(node)
        self._functions.pop()
        if not node.body:  # a metric function's logging, all of it
            node.body = [ast.Pass()]
        return node

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


def logging_only_names(tree: ast.Module, metrics: set[str] | None = None) -> set[str]:
    """Names assigned only to be logged: read by logging code and by nothing else, to a fixed
    point (a value computed for a log, then one computed from it...). ``metrics``: the functions
    whose result only feeds logs (``metric_functions(tree)`` when None)."""
    drop: set[str] = set()
    metrics = metric_functions(tree) if metrics is None else metrics
    bags = containers(tree)
    while True:
        stripper = _StripLogging(drop, containers=bags, metrics=metrics)
        kept = stripper.visit(_copy(tree))
        feeds_logs = _loaded(stripper.removed) - _loaded([kept], bags)
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
    flags, assignments to names that only those calls read, entries added to a dict or list that
    only they read, and what a ``compute_metrics`` function returns (``metric_functions``).

    >>> non_logging_changes("x = f()", "x = f()\\ngn = norm(x)\\nprint(gn)")
    False
    >>> non_logging_changes("clip(p)", "gn = clip(p)\\nflor.log('gn', gn)")  # the recording's call, its result kept
    False
    >>> non_logging_changes("x = f()", "def norm(v):\\n    return v.norm()\\nx = f()\\nflor.log('n', norm(x))")
    False
    >>> non_logging_changes("x = f()", "x = g()")
    True
    >>> metric = "def m(p):\\n    out = {'acc': acc(p)}\\n    return out\\nTrainer(compute_metrics=m)"
    >>> non_logging_changes(metric, metric.replace("    return", "    out['top'] = top(p)\\n    return"))
    False
    """
    try:
        a, b = ast.parse(recorded), ast.parse(current)
    except SyntaxError:
        return recorded != current
    # one set for both: a value that only feeds a log in one version goes in the other one too
    metrics = metric_functions(a) | metric_functions(b)
    drop = logging_only_names(a, metrics) | logging_only_names(b, metrics)

    def stripped(tree: ast.Module, keep_calls: bool = False) -> str:
        return ast.dump(_StripLogging(drop, keep_calls=keep_calls, containers=containers(tree),
                                      metrics=metrics).visit(_copy(tree)))

    if stripped(a) == stripped(b):
        return False
    # a call whose result the edit keeps for a log: the call stays, as the recording made it
    return stripped(a, keep_calls=True) != stripped(b, keep_calls=True)
