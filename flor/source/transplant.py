"""Today's added logging, moved into an older version of the script (``flor replay --all``).

A sweep is often recorded over several versions of the training script. To replay a run
recorded with an older version, flor runs *that version* with the logging that today's
script added: ``flor.log``/``print``/``logging`` calls, assignments whose names only those
calls read (and ``if`` statements whose body is only logging), and ``probed=True`` flags on
``SkipBlock.step_into``. Nothing else of today's script goes in, so the replay computes
exactly what the run computed.

Placement is by the syntax tree, not by line numbers. An added statement is placed after its
*anchor*, the statement before it in today's script that is not itself added (or at the top
of its block when there is none), inside the block that corresponds to its enclosing block:

- enclosing blocks correspond when their chain of enclosing statements matches, each by its
  header (``for epoch in flor.it(...)``, ``if flor.SkipBlock.step_into("train")``,
  ``def evaluate``) with ``probed=`` and logging wrappers taken out;
- the anchor matches the one statement of that block with the same normalized dump (a
  compound statement by its header only, so training code changed inside it does not matter).

A statement that cannot be placed without ambiguity (its anchor or an enclosing statement is
missing, or there twice; it reads a name the older script never defines) raises
:class:`TransplantError` naming the statement and the reason: that run is then skipped.

The result is text: the older source with today's statements inserted as whole lines, so the
patch (``flor replay --dry-run``) shows only added lines and flag edits.

>>> old = "import flor\\nfor e in range(3):\\n    x = train(e)\\n"
>>> transplant(old, "import flor\\nfor e in range(3):\\n    x = train2(e)\\n    flor.log('x', x)\\n")
Traceback (most recent call last):
...
flor.source.transplant.TransplantError: cannot place `flor.log('x', x)` (line 4 of today's script): its anchor `x = train2(e)` is not in the older script
"""  # noqa: E501 - a doctest's expected output is one line

from __future__ import annotations

import ast
import builtins
import difflib
from dataclasses import dataclass, field
from typing import Any

from ..errors import ReplayError
# edits owns what counts as logging (the same rules decide "changed by more than logging")
from .edits import assigned, dotted, flor_log_value, is_logging_call, logging_only_names

__all__ = ["Transplant", "TransplantError", "transplant", "unified_patch"]


class TransplantError(ReplayError):
    """Today's logging cannot be placed in a run's older script without ambiguity."""


@dataclass
class Transplant:
    """The older source with today's logging in it, and what was placed where."""

    source: str
    placed: list[str] = field(default_factory=list)  # one line per inserted statement or flag

    @property
    def changed(self) -> bool:
        return bool(self.placed)


_BLOCK_FIELDS = ("body", "orelse", "finalbody")


def _short(stmt: ast.AST, limit: int = 70) -> str:
    text = " ".join(ast.unparse(stmt).split("\n")[0].split())
    if isinstance(stmt, ast.stmt) and _is_compound(stmt):
        text = _header_text(stmt)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_compound(stmt: ast.stmt) -> bool:
    return any(isinstance(getattr(stmt, f, None), list) and getattr(stmt, f) and
               isinstance(getattr(stmt, f)[0], ast.stmt) for f in _BLOCK_FIELDS) or isinstance(stmt, ast.Try)


def _header_text(stmt: ast.stmt) -> str:
    head = ast.unparse(_header(stmt)) if not isinstance(stmt, ast.Try) else "try"
    return head.split("\n")[0].rstrip(":") + ":"


class _Normalize(ast.NodeTransformer):
    """``probed=`` flags out, ``flor.log(name, value)`` -> ``value``: what two versions share."""

    def visit_Call(self, node: ast.Call) -> Any:
        node.keywords = [k for k in node.keywords if k.arg != "probed"]
        value = flor_log_value(node)
        if value is not None:
            return self.visit(value)
        return self.generic_visit(node)


def _header(stmt: ast.stmt) -> ast.stmt:
    """The statement without its blocks (a copy): ``for x in y: pass``."""
    clone = ast.parse(ast.unparse(stmt)).body[0]
    for f in _BLOCK_FIELDS:
        if isinstance(getattr(clone, f, None), list):
            setattr(clone, f, [ast.Pass()] if f == "body" else [])
    if isinstance(clone, ast.Try):
        clone.handlers = []
    if isinstance(clone, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        clone.decorator_list = []
    return clone


def _key(stmt: ast.stmt) -> str:
    """What identifies a statement across versions: its normalized dump (a compound one's header)."""
    node = _header(stmt) if _is_compound(stmt) else ast.parse(ast.unparse(stmt)).body[0]
    return ast.dump(_Normalize().visit(node))


def _blocks(stmt: ast.stmt) -> list[tuple[str, list[ast.stmt]]]:
    """The statement's blocks by a name stable across versions (``body``, ``orelse``, ``handler0``...)."""
    out = [(f, getattr(stmt, f)) for f in _BLOCK_FIELDS if isinstance(getattr(stmt, f, None), list)
           and getattr(stmt, f) and isinstance(getattr(stmt, f)[0], ast.stmt)]
    for i, h in enumerate(getattr(stmt, "handlers", []) or []):
        out.append((f"handler{i}", h.body))
    return out


def _logging_stmt(stmt: ast.stmt, drop: set[str], old_names: set[str]) -> bool:
    """A statement that only logs: a logging call, an assignment of a new name that only logging
    reads, or an ``if`` whose blocks are only that.

    A name the older script binds too is not new: ``x = train2(e)`` where the older script has
    ``x = train(e)`` is changed training code, even when only a log reads ``x`` today."""
    if isinstance(stmt, ast.Expr):
        return is_logging_call(stmt.value)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        names = assigned(stmt)
        if not names:
            return False
        return names <= drop and not names & old_names
    if isinstance(stmt, ast.If):
        return all(_logging_stmt(s, drop, old_names) for s in stmt.body + stmt.orelse)
    return False


def _bound_names(tree: ast.AST) -> set[str]:
    """Every name the script binds anywhere (assignments, loops, imports, defs, arguments)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
    return out


@dataclass
class _Insert:
    line: int  # insert before this 0-based line of the older source
    indent: str
    text: str
    order: int


class _Placer:
    def __init__(self, old_src: str, new_src: str) -> None:
        self.old_src, self.new_src = old_src, new_src
        try:
            self.old, self.new = ast.parse(old_src), ast.parse(new_src)
        except SyntaxError as exc:
            raise TransplantError(f"cannot read the script: {exc}; replay that run by hand with its own "
                                  "recorded source") from exc
        self.drop = logging_only_names(self.new)
        self.old_names = _bound_names(self.old)
        self.known = self.old_names | set(dir(builtins)) | {"__file__", "__name__"}
        self.inserts: list[_Insert] = []
        self.flags: list[tuple[ast.Call, ast.keyword | None]] = []  # old step_into calls to mark probed
        self.placed: list[str] = []
        self.old_lines = old_src.splitlines(keepends=True)

    def fail(self, stmt: ast.stmt, why: str) -> TransplantError:
        return TransplantError(f"cannot place `{_short(stmt)}` (line {stmt.lineno} of today's script): {why}")

    # -- matching ----------------------------------------------------------------------

    def _find(self, stmt: ast.stmt, block: list[ast.stmt], *,
              occurrence: tuple[int, int] | None = None) -> list[ast.stmt]:
        key = _key(stmt)
        found = [s for s in block if _key(s) == key]
        if occurrence is not None and len(found) == occurrence[1]:  # the k-th of as many: the same one
            return [found[occurrence[0]]]
        return found

    def walk(self, new_block: list[ast.stmt], old_block: list[ast.stmt] | None, chain: list[ast.stmt],
             old_parent: ast.stmt | None) -> None:
        old_keys = {_key(s) for s in old_block} if old_block is not None else set()
        anchor: ast.stmt | None = None  # today's statement before the next added one
        for stmt in new_block:
            added = _logging_stmt(stmt, self.drop, self.old_names) and (old_block is None or _key(stmt) not in old_keys)
            if added:
                if old_block is None:
                    raise self.fail(stmt, f"its enclosing statement `{_short(chain[-1])}` is not in the older script")
                self.place(stmt, anchor, old_block, old_parent)
                continue
            anchor = stmt
            self.probed_flag(stmt)
            for name, body in _blocks(stmt):
                self.walk(body, self.old_block_of(stmt, name, new_block, old_block), [*chain, stmt], None)

    def old_block_of(self, stmt: ast.stmt, name: str, new_block: list[ast.stmt],
                     old_block: list[ast.stmt] | None) -> list[ast.stmt] | None:
        if old_block is None:
            return None
        same = [s for s in new_block if _key(s) == _key(stmt)]
        found = self._find(stmt, old_block, occurrence=(same.index(stmt), len(same)))
        if len(found) != 1:
            return None  # only an added statement inside needs it: that one says why
        return dict(_blocks(found[0])).get(name)

    def place(self, stmt: ast.stmt, anchor: ast.stmt | None, old_block: list[ast.stmt],
              old_parent: ast.stmt | None) -> None:
        missing = sorted(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                         and n.id not in self.known | _bound_names(stmt))  # its own comprehensions
        if missing:
            raise self.fail(stmt, f"it reads {missing[0]!r}, which the older script never defines")
        if anchor is None:
            first = old_block[0]
            line, col = first.lineno - 1, first.col_offset
            if self.old_lines and line < len(self.old_lines) and self.old_lines[line][:col].strip():
                raise self.fail(stmt, "its block in the older script starts on the line of its header")
            where = "at the top of its block"
        else:
            found = self._find(anchor, old_block)
            if not found:
                raise self.fail(stmt, f"its anchor `{_short(anchor)}` is not in the older script")
            if len(found) > 1:
                raise self.fail(stmt, f"its anchor `{_short(anchor)}` is in the older script {len(found)} times "
                                      f"(lines {', '.join(str(s.lineno) for s in found)})")
            target = found[0]
            line, col = target.end_lineno or target.lineno, target.col_offset
            if any(s is not target and s.lineno == target.lineno for s in old_block) or \
                    self.old_lines[line - 1].rstrip().endswith(";"):
                raise self.fail(stmt, f"its anchor `{_short(anchor)}` shares its line with other statements")
            where = f"after line {line}"
        indent = self.old_lines[(old_block[0].lineno - 1)][: old_block[0].col_offset]
        for name in assigned(stmt) or ():
            self.known.add(name)  # a later statement may read it
        self.inserts.append(_Insert(line, indent, ast.unparse(stmt), len(self.inserts)))
        self.placed.append(f"`{_short(stmt)}` (line {stmt.lineno}) {where} of the older script")

    def probed_flag(self, stmt: ast.stmt) -> None:
        """``step_into("name", probed=True)`` today: the same block in the older script gets the flag."""
        for call in (n for n in ast.walk(_header(stmt) if _is_compound(stmt) else stmt) if isinstance(n, ast.Call)):
            if not (dotted(call.func).endswith("step_into") and call.args and isinstance(call.args[0], ast.Constant)):
                continue
            flag = next((k for k in call.keywords if k.arg == "probed"), None)
            if flag is None or not (isinstance(flag.value, ast.Constant) and flag.value.value is True):
                continue
            name = call.args[0].value
            olds = [c for c in ast.walk(self.old) if isinstance(c, ast.Call) and dotted(c.func).endswith("step_into")
                    and c.args and isinstance(c.args[0], ast.Constant) and c.args[0].value == name]
            if len(olds) != 1:
                why = "is not in the older script" if not olds else f"is there {len(olds)} times"
                raise self.fail(stmt, f"the block step_into({name!r}) {why}")
            old_flag = next((k for k in olds[0].keywords if k.arg == "probed"), None)
            if old_flag is not None and isinstance(old_flag.value, ast.Constant) and old_flag.value.value is True:
                continue
            self.flags.append((olds[0], old_flag))
            self.placed.append(f"probed=True on step_into({name!r}) (line {olds[0].lineno} of the older script)")

    # -- the text ------------------------------------------------------------------------

    def render(self) -> str:
        lines = list(self.old_lines)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        # flags first: they edit within lines, inserts only add whole lines after
        for call, kw in sorted(self.flags, key=lambda x: (x[0].end_lineno, x[0].end_col_offset), reverse=True):
            if kw is not None:  # probed=False or probed=x: the keyword's text becomes probed=True
                i, a, b = kw.lineno - 1, kw.col_offset, kw.end_col_offset
                if kw.end_lineno != kw.lineno:
                    raise TransplantError(f"cannot set probed=True on the call at line {call.lineno} of the older "
                                          "script: its probed= argument spans lines")
                lines[i] = lines[i][:a] + "probed=True" + lines[i][b:]
            else:
                args: list[ast.expr | ast.keyword] = [*call.args, *call.keywords]
                last = max(args, key=lambda n: (n.end_lineno, n.end_col_offset))
                i, b = (last.end_lineno or last.lineno) - 1, last.end_col_offset or 0
                lines[i] = lines[i][:b] + ", probed=True" + lines[i][b:]  # right after the last argument
        for ins in sorted(self.inserts, key=lambda x: (x.line, x.order), reverse=True):
            text = "".join(ins.indent + row + "\n" for row in ins.text.split("\n"))
            lines.insert(ins.line, text)
        return "".join(lines)


def transplant(old: str, new: str) -> Transplant:
    """``old`` (a run's recorded script) with the logging that ``new`` (today's) added; see the module docstring.

    >>> old = "import flor\\nfor e in range(2):\\n    x = f(e)\\n"
    >>> new = "import flor\\nfor e in range(2):\\n    x = g(e)\\n    flor.log('x', x)\\n"
    >>> print(transplant(old, new.replace("g(e)", "f(e)")).source, end="")
    import flor
    for e in range(2):
        x = f(e)
        flor.log('x', x)
    """
    placer = _Placer(old, new)
    placer.walk(placer.new.body, placer.old.body, [], None)
    if not placer.inserts and not placer.flags:
        return Transplant(old)
    source = placer.render()
    try:
        ast.parse(source)
    except SyntaxError as exc:  # a placement this module got wrong must not reach training
        raise TransplantError(f"the transplanted script does not parse ({exc}); replay that run by hand") from exc
    return Transplant(source, placer.placed)


def unified_patch(old: str, new: str, label: str) -> str:
    """The unified diff from ``old`` to ``new``, with ``a/label`` and ``b/label`` as names."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        f"a/{label}", f"b/{label}"))
