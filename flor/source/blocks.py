"""Names a block assigns, which a replay that restores the block does not assign.

A replay that restores a block skips its body: a name the body assigns keeps what it had before
the block, or stays unbound, unless ``end()`` is given it and the result is unpacked into it.
Two mistakes follow, both common in scripts that log the last batch's loss after the block:

- the block assigns a name that ``end()`` is not given, and the code after ``end()`` reads it
  (``flor.log("loss", loss.item())``): a replay reads a stale value, or stops with a NameError.
  ``stale_names`` finds these in the script's source: the ``if`` whose test calls ``step_into``
  and the statement that calls ``end()`` are siblings in one body. Those that are plain data (a
  number, a 0-d tensor) are noted at ``end()`` and set by a replay (``flor.watch.variables.BlockVars``),
  so the record and replay sessions name only the rest (a batch, an output tensor);
- ``end()`` is given a name that was not bound when the block was first entered (``val`` first
  assigned inside it): a replay that skips that run has no ``val`` to give ``end()``
  (NameError). ``unbound_given`` finds these from the names bound at the block's first entry.

>>> src = '''
... for epoch in flor.it(range(3)):
...     if flor.SkipBlock.step_into("train"):
...         for x in data:
...             loss = step(x)
...     net = flor.SkipBlock.end(net)
...     flor.log("loss", loss.item())
... '''
>>> sorted(stale_names(ast.parse(src), 3, 6))
['loss']
"""

from __future__ import annotations

import ast
import linecache
from types import FrameType
from typing import Iterable

#: nested scopes: what they bind is theirs; a def's body does not run where it stands
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)
_GUARDS = {"replaying", "recording"}  # code under `if flor.replaying():` is not the recording's reader


def _names(node: ast.AST | list, ctx: type) -> set[str]:
    """The names ``node`` stores (``ast.Store``) or reads (``ast.Load``) in its own scope; a lambda
    or comprehension reads the names it does not bind itself."""
    out: set[str] = set()
    stack = list(node) if isinstance(node, list) else [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ctx):
            out.add(n.id)
        for child in ast.iter_child_nodes(n):
            if not isinstance(child, _SCOPES):
                stack.append(child)
            elif ctx is ast.Load and isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                                        ast.GeneratorExp)):
                inner = [g for g in ast.iter_child_nodes(child)]
                out |= _names(inner, ast.Load) - _names(inner, ast.Store) - _lambda_args(child)
    return out


def _lambda_args(node: ast.AST) -> set[str]:
    return {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)} if isinstance(node, ast.Lambda) else set()


def _guarded(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Call) and (getattr(n.func, "attr", None) or getattr(n.func, "id", None)) in _GUARDS
               for n in ast.walk(test))


def _read_first(stmts: list[ast.stmt]) -> set[str]:
    """Names the statements may read before they assign them themselves (approximately: only an
    assignment at this level, which always runs, counts as assigning)."""
    read: set[str] = set()
    bound: set[str] = set()
    for s in stmts:
        if isinstance(s, (ast.For, ast.AsyncFor)):
            loads = _names(s.iter, ast.Load) | (_read_first(s.body) - _names(s.target, ast.Store)) \
                | _read_first(s.orelse)
        elif isinstance(s, ast.If):
            loads = set() if _guarded(s.test) else \
                _names(s.test, ast.Load) | _read_first(s.body) | _read_first(s.orelse)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            items = [i.context_expr for i in s.items]
            targets = [i.optional_vars for i in s.items if i.optional_vars is not None]
            loads = _names(items, ast.Load) | (_read_first(s.body) - _names(targets, ast.Store))
        else:
            loads = _names(s, ast.Load)
        read |= loads - bound
        if isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            bound |= _names(s, ast.Store)
    return read


def _bodies(tree: ast.AST) -> Iterable[list[ast.stmt]]:
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                yield stmts


def stale_names(tree: ast.Module, into_line: int, end_line: int) -> set[str]:
    """Names that the ``if`` testing ``step_into`` at ``into_line`` assigns in its body, that the
    statement calling ``end()`` at ``end_line`` (its sibling) neither is given nor assigns, and
    that the statements after it read before assigning them. Empty when the two are not
    siblings (a block spread over functions): nothing is claimed then."""
    for stmts in _bodies(tree):
        for i, s in enumerate(stmts):
            if not (isinstance(s, ast.If) and s.test.lineno <= into_line <= (s.test.end_lineno or s.test.lineno)):
                continue
            for j in range(i + 1, len(stmts)):
                end = stmts[j]
                if end.lineno <= end_line <= (end.end_lineno or end.lineno):
                    assigned = _names(s.body, ast.Store) - _names(end, ast.Load) - _names(end, ast.Store)
                    return assigned & _read_first(stmts[j + 1:])
            return set()
    return set()


def _flow(stmts: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """``(read first, bound)`` of the statements: the names they may read before they bind them,
    and those they bind. Unlike ``_read_first``, what a ``for``, ``while`` or ``with`` body binds
    counts as bound after it (a training loop's body runs), and an ``if`` binds what both its
    branches bind: this is how a block's next run reads (``carried_names``)."""
    read: set[str] = set()
    bound: set[str] = set()
    for s in stmts:
        if isinstance(s, (ast.For, ast.AsyncFor)):
            targets = _names(s.target, ast.Store)
            r, b = _flow(s.body)
            loads, binds = _names(s.iter, ast.Load) | (r - targets), targets | b
        elif isinstance(s, ast.While):
            r, b = _flow(s.body)
            loads, binds = _names(s.test, ast.Load) | r, b
        elif isinstance(s, ast.If):
            if _guarded(s.test):
                loads, binds = set(), set()
            else:
                (r1, b1), (r2, b2) = _flow(s.body), _flow(s.orelse)
                loads, binds = _names(s.test, ast.Load) | r1 | r2, b1 & b2
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            targets = _names([i.optional_vars for i in s.items if i.optional_vars is not None], ast.Store)
            r, b = _flow(s.body)
            loads, binds = _names([i.context_expr for i in s.items], ast.Load) | (r - targets), targets | b
        elif isinstance(s, ast.Try):
            r, b = _flow(s.body)
            loads, binds = r | _names(list(s.handlers) + s.orelse + s.finalbody, ast.Load), b
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            loads, binds = _names(s.decorator_list, ast.Load), {s.name}
        else:
            loads, binds = _names(s, ast.Load), _names(s, ast.Store)
            if isinstance(s, ast.AugAssign):  # `x += 1` reads x first
                loads |= binds
        read |= loads - bound
        bound |= binds
    return read, bound


def _block(tree: ast.Module, into_line: int) -> tuple[list[ast.stmt], int] | None:
    """The statements holding the ``if`` whose test calls ``step_into`` at ``into_line``, and its index."""
    for stmts in _bodies(tree):
        for i, s in enumerate(stmts):
            if isinstance(s, ast.If) and s.test.lineno <= into_line <= (s.test.end_lineno or s.test.lineno):
                return stmts, i
    return None


def carried_names(tree: ast.Module, into_line: int, end_line: int) -> set[str]:
    """Names a block's run binds that its next run reads before binding them (a prefetched batch,
    ``X, Y = get_batch()`` at the end of an iteration; a hidden state carried across chunks), that
    the statement calling ``end()`` at ``end_line`` (a sibling of the block's ``if``) is neither
    given nor assigns. Empty when the two are not siblings.

    >>> src = '''
    ... X = get_batch()
    ... for epoch in flor.it(range(3)):
    ...     if flor.SkipBlock.step_into("train"):
    ...         for it in range(10):
    ...             loss = model(X)
    ...             X = get_batch()
    ...             checkpoint = {"model": model.state_dict()}
    ...         print(loss)
    ...     model = flor.SkipBlock.end(model)
    ... '''
    >>> sorted(carried_names(ast.parse(src), 4, 10))
    ['X']
    """
    found = _block(tree, into_line)
    if found is None:
        return set()
    stmts, i = found
    block = stmts[i]
    assert isinstance(block, ast.If)
    for end in stmts[i + 1:]:
        if end.lineno <= end_line <= (end.end_lineno or end.lineno):
            read, _ = _flow(block.body)
            return (read & _names(block.body, ast.Store)) - _names(end, ast.Load) - _names(end, ast.Store)
    return set()


def _loads_outside(tree: ast.Module, node: ast.AST) -> set[str]:
    """Names read anywhere in the script (in its functions too) but inside ``node``."""
    inside = {id(n) for n in ast.walk(node)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and id(n) not in inside}


def unread_outside(tree: ast.Module, into_line: int, names: Iterable[str]) -> set[str]:
    """Those of ``names`` that nothing outside the block at ``into_line`` reads and that the block
    binds before it reads them (nanoGPT's ``checkpoint`` dict, built for ``torch.save`` inside
    the block): not state, whatever they hold. Empty when the block is not found.

    >>> src = '''
    ... checkpoint = None
    ... for epoch in flor.it(range(3)):
    ...     if flor.SkipBlock.step_into("train"):
    ...         checkpoint = {"model": model.state_dict()}
    ...         torch.save(checkpoint, "ckpt.pt")
    ...     model = flor.SkipBlock.end(model)
    ... '''
    >>> sorted(unread_outside(ast.parse(src), 4, ["checkpoint", "model"]))
    ['checkpoint']
    """
    found = _block(tree, into_line)
    if found is None:
        return set()
    block = found[0][found[1]]
    assert isinstance(block, ast.If)
    return set(names) - _flow(block.body)[0] - _loads_outside(tree, block)


def _calls(node: ast.AST, name: str) -> bool:
    return any(isinstance(c, ast.Call) and _called(c) == name for c in ast.walk(node))


def loop_names(tree: ast.Module, line: int) -> tuple[set[str], set[str]] | None:
    """``(live, carried)`` for the ``for`` loop over ``flor.it`` at ``line``: the names its body may
    read before binding them or code outside it reads (what the next epoch needs), and the names
    its blocks carry into their next run (``carried_names``: a block's checkpoint holds them).
    None when no such loop is found."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor)) and node.lineno <= line <= (node.iter.end_lineno or line):
            live = _flow(node.body)[0] | _loads_outside(tree, node)
            carried: set[str] = set()
            for i, s in enumerate(node.body):
                if isinstance(s, ast.If) and _calls(s.test, "step_into"):
                    end = next((e for e in node.body[i + 1:] if _calls(e, "end")), None)
                    if end is not None:
                        carried |= carried_names(tree, s.test.lineno, end.lineno)
            return live, carried
    return None


_TREES: dict[str, ast.Module | None] = {}


def script_tree(frame: FrameType) -> ast.Module | None:
    filename = frame.f_code.co_filename
    if filename not in _TREES:
        try:
            _TREES[filename] = ast.parse("".join(linecache.getlines(filename, frame.f_globals)))
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            _TREES[filename] = None
    return _TREES[filename]


# -- a module's plain attributes -------------------------------------------------------------


# -- an iterator wrapped around flor.it ------------------------------------------------------

#: wrappers that count or pair the items flor.it yields, or stop pulling from it: a replay
#: worker that starts mid-run skips the epochs before its own inside flor.it, where they do not
#: see it (tqdm, iter() and the like only pass items on, and are not named)
_MID_RUN = ("a replay worker that starts mid-run (--replay_flor PID/N, flor replay) skips the epochs before its own "
            "inside flor.it, so ")
_WRAPPERS = {
    "enumerate": _MID_RUN + "enumerate() counts from 0 at that worker's first epoch, not at the recording's epoch 0",
    "zip": _MID_RUN + "zip() pairs that worker's first epoch with the first item of the other iterables",
    "zip_longest": _MID_RUN
    + "zip_longest() pairs that worker's first epoch with the first item of the other iterables",
    "map": _MID_RUN + "map() pairs that worker's first epoch with the first item of the other iterables",
    "islice": "islice() stops pulling from flor.it after its last item, so flor never sees the last epoch end: the "
              "recording does not count it, and a replay leaves it out",
}
#: the wrappers whose worker that starts mid-run gets other values than the recording
WRONG_MID_RUN = frozenset({"enumerate", "zip", "zip_longest", "map"})


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def wrapper_at(tree: ast.Module, line: int) -> str | None:
    """The name of the call (``enumerate``, ``zip``, ``islice``...; ``_WRAPPERS``) whose argument is
    a call of ``it`` spanning ``line``, or None.

    >>> wrapper_at(ast.parse("for i, epoch in enumerate(flor.it(range(9))):\\n    pass"), 1)
    'enumerate'
    >>> wrapper_at(ast.parse("for epoch, lr in zip(\\n        flor.it(range(9)), lrs):\\n    pass"), 2)
    'zip'
    >>> print(wrapper_at(ast.parse("for i, epoch in flor.it(enumerate(range(9))):\\n    pass"), 1))
    None
    >>> print(wrapper_at(ast.parse("for epoch in tqdm(flor.it(range(9))):\\n    pass"), 1))
    None
    """
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _called(node) not in _WRAPPERS \
                or not node.lineno <= line <= (node.end_lineno or node.lineno):
            continue
        for arg in node.args:
            if (isinstance(arg, ast.Call) and _called(arg) == "it"
                    and arg.lineno <= line <= (arg.end_lineno or arg.lineno)):
                name = _called(node)
                return None if name == "map" and len(node.args) < 3 else name
    return None


def loop_wrapper(frame: FrameType | None) -> str | None:
    """``wrapper_at`` the line of ``frame`` that calls ``flor.it``, read from the script's source
    (``for i, epoch in enumerate(flor.it(range(9)))``). Never raises."""
    try:
        if frame is None:
            return None
        tree = script_tree(frame)
        return wrapper_at(tree, frame.f_lineno) if tree is not None else None
    except Exception:  # noqa: BLE001 - advice only
        return None


def wrapper_advice(wrapper: str) -> str:
    """What ``loop_wrapper``'s find does to a replay, and the fix."""
    return (f"flor.it(...) is wrapped in {wrapper}(): {_WRAPPERS[wrapper]}; put the wrapper inside instead: "
            f"`for ... in flor.it({wrapper}(...))`")
