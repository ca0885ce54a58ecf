"""flor.cli.export: ``flor export`` in process on a hand-made store: what a dry run prints, and bad
input as one line with exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

import flor.cli.export
from helpers import fake_run
from flor.cli import main


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_run(tmp_path, [{"name": "acc", "value": 0.5, "epoch": 0}], [{"name": "wnorm", "value": 3.5, "epoch": 0}])
    monkeypatch.setattr(flor.cli.export, "SETTINGS", flor.cli.export.SETTINGS.__class__(home=tmp_path))
    return tmp_path


def test_a_dry_run_prints_each_value_and_writes_nothing(home: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["export", "ex", "--to", "tensorboard", "--logdir", str(home / "tb"), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("would write 2 value(s) (1 hindsight), 0 already there")
    assert out[1:] == ["  acc step=0 value=0.5", "  wnorm step=0 value=3.5 (hindsight)"]
    assert not (home / "tb").exists()


@pytest.mark.parametrize("argv, says", [
    (["export", "ex", "--to", "neptune"], "'neptune' is not a tracker flor exports to"),
    (["export", "ex", "--to", "mlflow", "--run", "r1", "--all"], "--run and --all"),
    (["export", "nothing-here", "--to", "mlflow"], "nothing-here"),
    (["export", "ex", "--to", "tensorboard"], "--logdir"),
])
def test_bad_input_is_one_line_and_exit_2(home: Path, capsys: pytest.CaptureFixture, argv: list[str],
                                          says: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("flor: error: ") and says in err and err.count("\n") == 1
