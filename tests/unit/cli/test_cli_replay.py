"""flor.cli.replay: ``flor replay`` interrupted before its launch starts (``flor.cli.main`` in
process).
"""

from __future__ import annotations

import sys


def test_ctrl_c_before_a_launch_starts_is_one_line(monkeypatch, capsys):
    """Ctrl-C while flor replay plans (reading many runs' manifests) was a KeyboardInterrupt
    traceback; it is one line and exit status 130, as for any flor command."""
    import flor.cli.replay
    from flor.cli import main

    def planning(name: str) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(flor.cli.replay, "validate_name", planning)
    assert main(["replay", "toy", "--all", "--", sys.executable, "train.py"]) == 130
    assert capsys.readouterr().err == "\nflor: interrupted\n"
