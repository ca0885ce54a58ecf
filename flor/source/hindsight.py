"""Where the script a replay runs adds ``flor.log`` calls the recorded script did not have, and
which SkipBlocks run them.

A hindsight ``flor.log`` inside a block's body, or in a function of the script that the block
calls (directly or through other functions of the script), runs only where the replay executes
that block; a replay that restores the block's runs from their checkpoints skips it, and the
values are silently missing. ``new_logs`` finds each new call, where it sits and the blocks that
run it, so a replay re-executes those blocks as ``probed=True`` would, and names a new log that
still never ran.

>>> recorded = '''
... def train(net):
...     loss = step(net)
...     return loss
... for epoch in flor.it(range(3)):
...     if flor.SkipBlock.step_into("train"):
...         train(net)
...     net = flor.SkipBlock.end(net)
...     flor.log("acc", evaluate(net))
... '''
>>> current = recorded.replace("    return loss", "    flor.log('loss', loss)\\n    return loss")
>>> new_logs(recorded, current)
[NewLog(name='loss', line=4, function='train', blocks=('train',), via='flor.log')]

A script that trains with a framework's Trainer and ``flor.integrations`` has no ``step_into``:
the callback runs one block an epoch, ``"training"`` (``flor.hooks.Epochs``), and the Trainer
calls the script's training hooks in it (``compute_loss``, ``training_step``, a callback's
``on_step_end``...). A new ``flor.log`` in one of those, or in a function it calls, is run by
that block; so is a new ``self.log``/``self.log_dict`` of a LightningModule, whose values the
callback gives flor.
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import NamedTuple

from .edits import dotted

__all__ = ["NewLog", "new_logs"]

#: the block flor.hooks.Epochs runs each epoch's training steps in (what the integrations drive)
FRAMEWORK_BLOCK = "training"

#: methods a Trainer calls inside an epoch's training steps: Lightning's LightningModule and
#: Callback hooks, the Hugging Face Trainer's overridable steps and TrainerCallback hooks
TRAINING_HOOKS = frozenset({
    "training_step", "on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "optimizer_step", "backward", "configure_gradient_clipping",
    "compute_loss", "on_step_begin", "on_step_end", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step",
})


class NewLog(NamedTuple):
    name: str | None  # the name it logs, when a constant string
    line: int  # in the current script
    function: str | None  # the function of the script it sits in
    blocks: tuple[str, ...]  # the SkipBlocks whose runs execute it
    via: str = "flor.log"  # the call: flor.log, or a LightningModule's self.log / self.log_dict

    def call(self) -> str:
        """``flor.log('loss', ...)``."""
        return f"{self.via}({self.name!r}, ...)" if self.name is not None else f"{self.via}(...)"

    def where(self) -> str:
        """``line 12, in train()``."""
        return f"line {self.line}" + (f", in {self.function}()" if self.function else "")


def _is_log(node: ast.AST, framework: bool = False) -> bool:
    """``flor.log(...)``; with ``framework``, also a LightningModule's ``self.log(...)`` and
    ``self.log_dict(...)``, whose values FlorCallback gives flor."""
    names = ("flor.log", "log", "self.log", "self.log_dict") if framework else ("flor.log", "log")
    return isinstance(node, ast.Call) and dotted(node.func) in names


def _block_name(node: ast.If) -> str | None:
    """The name of the SkipBlock whose ``step_into`` the ``if`` tests (a constant string), or None."""
    for call in ast.walk(node.test):
        if isinstance(call, ast.Call) and dotted(call.func).endswith("step_into") and call.args \
                and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
            return call.args[0].value
    return None


def _called(nodes: list[ast.stmt]) -> set[str]:
    """Names of what ``nodes`` call: ``f(...)``, ``self.f(...)``, ``obj.f(...)``."""
    out: set[str] = set()
    for node in nodes:
        for call in ast.walk(node):
            if isinstance(call, ast.Call):
                fn = call.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
                if name:
                    out.add(name)
    return out


class _Sites(ast.NodeVisitor):
    """Each ``flor.log`` call with the innermost function and the SkipBlocks' bodies it sits in;
    what each function of the script and each block's body calls."""

    def __init__(self, framework: bool = False) -> None:
        self.framework = framework  # the script trains with a flor.integrations callback
        self.logs: list[tuple[ast.Call, str | None, tuple[str, ...]]] = []
        self.calls: dict[str, set[str]] = {}  # function -> what it calls
        self.block_calls: dict[str, set[str]] = {}  # block -> what its body calls
        self._functions: list[str] = []
        self._blocks: list[str] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.calls.setdefault(node.name, set()).update(_called(node.body))
        self._functions.append(node.name)
        self.generic_visit(node)
        self._functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_If(self, node: ast.If) -> None:
        name = _block_name(node)
        if name is None:
            self.generic_visit(node)
            return
        self.visit(node.test)
        self.block_calls.setdefault(name, set()).update(_called(node.body))
        self._blocks.append(name)
        for stmt in node.body:
            self.visit(stmt)
        self._blocks.pop()
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Call(self, node: ast.Call) -> None:
        if _is_log(node, self.framework):
            self.logs.append((node, self._functions[-1] if self._functions else None, tuple(self._blocks)))
        self.generic_visit(node)


def _reaches(sites: _Sites, block: str) -> set[str]:
    """The functions of the script a block's body calls, directly or through others."""
    seen: set[str] = set()
    todo = [f for f in sites.block_calls.get(block, ()) if f in sites.calls]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += [g for g in sites.calls[f] if g in sites.calls and g not in seen]
    return seen


def _integrated(tree: ast.Module) -> bool:
    """The script imports a ``flor.integrations`` module (a framework's Trainer drives its epochs)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flor.integrations"):
            return True
        if isinstance(node, ast.Import) and any(a.name.startswith("flor.integrations") for a in node.names):
            return True
    return False


def new_logs(recorded: str, current: str) -> list[NewLog]:
    """The ``flor.log`` calls of ``current`` that ``recorded`` does not have (compared by their
    text, function and enclosing blocks, as often as they occur), each with the SkipBlocks that
    run it: the blocks whose body holds it, or whose body calls the function it sits in.
    Empty when either does not parse."""
    try:
        before, now = ast.parse(recorded), ast.parse(current)
    except (SyntaxError, ValueError, RecursionError):
        return []
    framework = _integrated(now)
    old = _Sites(framework)
    old.visit(before)
    # the same call in the same function and blocks is the recording's (moved lines are not new)
    have = Counter((ast.unparse(call), function, inside) for call, function, inside in old.logs)
    sites = _Sites(framework)
    sites.visit(now)
    if framework:  # the framework's block runs the script's training hooks
        sites.block_calls.setdefault(FRAMEWORK_BLOCK, set()).update(TRAINING_HOOKS & set(sites.calls))
    reaching = {block: _reaches(sites, block) for block in sites.block_calls}
    out = []
    for call, function, inside in sites.logs:
        text = (ast.unparse(call), function, inside)
        if have[text] > 0:
            have[text] -= 1
            continue
        blocks = set(inside) | {b for b, functions in reaching.items() if function in functions}
        first = call.args[0] if call.args else None
        name = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
        via = dotted(call.func) if dotted(call.func).startswith("self.") else "flor.log"
        out.append(NewLog(name, call.lineno, function, tuple(sorted(blocks)), via))
    return out
