"""flor.hparams: ``flor.arg`` values from the command line, and the script's argparse namespace
captured as the run's hyperparameters.
"""

from __future__ import annotations

import argparse

import pytest

from flor import hparams
from flor.errors import ConfigError

# -- hyperparameters ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, default, value", [
    (["--lr", "0.5"], 0.1, 0.5),
    (["--lr=0.5"], 0.1, 0.5),
    (["--lr", "-1e-3"], 0.1, -1e-3),
    (["--other", "1"], 0.1, 0.1),
    (["--lr", "3"], 1, 3),
    (["--lr"], False, True),
    (["--lr", "no"], True, False),
    (["--lr", "adam"], "sgd", "adam"),
    (["--l-r", "2"], 1, 1),
])
def test_arg_command_line(argv, default, value):
    given, text = hparams._from_command_line("lr", argv)
    assert (hparams._convert("lr", text, default) if given else default) == value


def test_arg_dashes_and_bad_values():
    assert hparams._from_command_line("batch_size", ["--batch-size", "8"]) == (True, "8")
    with pytest.raises(ConfigError, match="not a valid int"):
        hparams._convert("n", "x", 3)


def test_argparse_namespace_is_captured_with_subparsers(monkeypatch):
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", argparse.ArgumentParser.parse_known_args)
    monkeypatch.setattr(hparams, "_CAPTURED", {})
    monkeypatch.setattr(hparams, "_LISTENERS", [])
    seen = []
    hparams.subscribe(seen.append)
    hparams.install_argparse_capture()
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--api-key", default="x")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("train").add_argument("--epochs", type=int, default=3)
    monkeypatch.setattr("sys.argv", ["train.py", "--lr", "0.2", "train", "--epochs", "5"])
    parser.parse_args()
    parser.parse_args(["--lr", "9", "train"])  # an explicit list is not the command line
    assert hparams.captured() == {"lr": 0.2, "api_key": "***", "cmd": "train", "epochs": 5}
    assert len(seen) == 1
