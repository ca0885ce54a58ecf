"""Fixtures and hooks of the whole suite: ``tests/unit/`` runs flor in process, ``tests/e2e/``
runs real scripts in subprocesses and is marked ``e2e`` (``-m "not e2e"`` is the fast lane). The shared helpers live in ``tests/helpers.py``; their names are re-exported here,
so ``from conftest import Runner`` works too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import (  # noqa: F401  (re-exported: ``from conftest import ...``)
    HERE, OUTER_LOG, PROBED_LOG, ROOT, SCRIPTS, Runner, Zygote, base_env, make_training, record_and_full_run,
    train_steps, values,
)

E2E = HERE / "e2e"


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
