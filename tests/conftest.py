"""The suite's layout, enforced: ``tests/unit/`` runs flor in process and starts no process,
``tests/e2e/`` runs real scripts in subprocesses and is marked ``e2e`` (``-m "not e2e"`` is the
fast lane). The shared helpers live in ``tests/helpers.py``; their names are re-exported here,
so ``from conftest import Runner`` works too.
"""

from __future__ import annotations

import compileall
import multiprocessing.util
import os
import socket
import subprocess
from pathlib import Path

import pytest

from helpers import (  # noqa: F401  (re-exported: ``from conftest import ...``)
    HERE, OUTER_LOG, PROBED_LOG, ROOT, SCRIPTS, Runner, Zygote, base_env, copy_of, make_training,
    record_and_full_run, train_steps, values,
)

E2E = HERE / "e2e"


def pytest_configure(config: pytest.Config) -> None:
    """flor's bytecode written once, before any test: the e2e tests start hundreds of Python
    processes, and where ``PYTHONDONTWRITEBYTECODE`` is set (this project's machines set it)
    each would compile flor's source again (~90 ms a process). ``compileall`` writes the
    ``__pycache__`` files regardless of that variable, as ``pip install`` does for a
    non-editable install; a checkout that cannot be written is left as it is."""
    compileall.compile_dir(ROOT / "flor", quiet=2)


def _is_e2e(path: Path) -> bool:
    return Path(path).is_relative_to(E2E)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ is marked ``e2e``; nothing else is."""
    for item in items:
        if _is_e2e(item.path):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def runner(tmp_path: Path) -> Runner:
    return Runner(tmp_path)


def _refuse(what: str):  # noqa: ANN202
    def refuse(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError(f"a unit test started a process ({what}): unit tests run flor in process; "
                             "a test that needs a subprocess belongs in tests/e2e/")
    return refuse


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test outside tests/e2e/ that starts a process fails, and says where it belongs."""
    if _is_e2e(request.node.path):
        return
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("subprocess"))
    monkeypatch.setattr(os, "fork", _refuse("os.fork"))
    monkeypatch.setattr(os, "forkpty", _refuse("os.forkpty"))
    monkeypatch.setattr(os, "system", _refuse("os.system"))
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"os.{name}"))
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", _refuse("multiprocessing"))
    monkeypatch.setattr(socket, "send_fds", _refuse("the warm interpreter of tests/zygote.py"))
