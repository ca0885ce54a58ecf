"""``FLOR_RANK_TIMEOUT`` as a setting, and flor.settings as the only reader of FLOR_* variables."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flor.errors import ConfigError
from flor.settings import parse

REPLAY = ["t.py", "--flor", "x", "--replay_flor"]
FLOR = Path(__file__).resolve().parents[2] / "flor"


@pytest.mark.parametrize("env, seconds", [({}, 600.0), ({"FLOR_RANK_TIMEOUT": ""}, 600.0),
                                          ({"FLOR_RANK_TIMEOUT": "30"}, 30.0),
                                          ({"FLOR_RANK_TIMEOUT": " 1.5 "}, 1.5)])
def test_rank_timeout_is_a_setting(env, seconds):
    for argv in (["t.py", "--flor", "x"], REPLAY):
        assert parse(argv, env)[0].rank_timeout == seconds


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "nan", "inf", "1e9", "10s"])
def test_a_bad_rank_timeout_names_the_variable_and_the_fix(bad):
    for argv in (["t.py"], ["t.py", "--flor", "x"], REPLAY):
        with pytest.raises(ConfigError, match=rf"FLOR_RANK_TIMEOUT={bad!r} is not a number of seconds > 0; "
                                               r"write e\.g\. FLOR_RANK_TIMEOUT=600"):
            parse(argv, {"FLOR_RANK_TIMEOUT": bad})


def _reads_of_flor_variables(tree: ast.AST) -> list[str]:
    """``X.get("FLOR_...")``, ``getenv("FLOR_...")`` and ``X["FLOR_..."]`` read (not written) in ``tree``."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("get", "getenv", "pop", "setdefault"):
                key = node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        if isinstance(key, str) and key.startswith("FLOR_"):
            found.append(f"line {node.lineno}: {key}")
    return found


def test_only_settings_reads_flor_variables():
    """DESIGN.md §7: every flag and FLOR_* variable is read in flor/settings.py only."""
    assert _reads_of_flor_variables(ast.parse('os.environ.get("FLOR_X")\nenv["FLOR_Y"] = 1\nenv["FLOR_Z"]')) == [
        "line 1: FLOR_X", "line 3: FLOR_Z"]  # the checker sees a read, and not a write
    readers = {}
    for path in sorted(FLOR.rglob("*.py")):
        if path.name != "settings.py" or path.parent != FLOR:
            found = _reads_of_flor_variables(ast.parse(path.read_text(), str(path)))
            if found:
                readers[str(path.relative_to(FLOR.parent))] = found
    assert readers == {}
