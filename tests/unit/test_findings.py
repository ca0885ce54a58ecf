"""Every warning and replay note carries a code of ``flor.findings.CATALOGUE``, and every code
there is emitted and documented in docs/findings.md."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from flor import findings
from flor.errors import warn

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "flor"
#: calls whose first argument is a finding code: errors.warn, Session.warn_once, ReplaySession.note,
#: a probe's say (flor.watch.probe)
CODED = {"warn": 0, "warn_once": 0, "note": 0, "say": 0}


def _coded_calls() -> list[tuple[str, int, str, object]]:
    """(file, line, function, first argument) of every call of warn, warn_once and note in flor/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name == "say" and "watch" not in path.parts:
                continue  # a spool's say is its progress line; its warnings go through warn
            if name in CODED and not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                                      and func.value.id == "warnings"):
                arg = node.args[CODED[name]]
                found.append((path.relative_to(ROOT).as_posix(), node.lineno, name,
                              arg.value if isinstance(arg, ast.Constant) else arg))
    return found


def test_every_warning_and_note_names_a_catalogued_code() -> None:
    calls = _coded_calls()
    assert len(calls) > 80  # the walk sees them (about 100 today)
    bad = [(f, line, name) for f, line, name, code in calls
           if not (isinstance(code, str) and code in findings.CATALOGUE)
           and not (isinstance(code, ast.Name) and code.id == "code")]  # passing a code on
    assert bad == [], f"give these a code from flor/findings.py: {bad}"


def test_every_catalogued_code_is_emitted() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py") if p.name != "findings.py")
    unused = sorted(code for code in findings.CATALOGUE if code not in text)
    assert unused == [], f"codes no longer emitted (drop them from the catalogue): {unused}"


def test_the_docs_are_the_catalogue() -> None:
    assert (ROOT / "docs" / "findings.md").read_text(encoding="utf-8") == findings.render_docs(), \
        "docs/findings.md is stale: render it again (see its first paragraph)"


@pytest.mark.parametrize("code", sorted(findings.CATALOGUE))
def test_codes_are_well_formed(code: str) -> None:
    entry = findings.CATALOGUE[code]
    assert findings.CODE.fullmatch(code) and entry.title and entry.fix


def test_warn_prints_the_code_first() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn("FL204", "SkipBlock.end('train') is not given `loss`")
    assert [str(w.message) for w in caught] == ["flor: FL204 SkipBlock.end('train') is not given `loss`"]
    assert findings.code_of(str(caught[0].message)) == "FL204"
