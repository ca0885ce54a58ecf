"""flor.logs.summary: a metric's goal (min or max) from its name, and its best and final values."""

from __future__ import annotations

from flor.logs.summary import goal_of, summarize


def test_summary_and_goals():
    assert [goal_of(n) for n in ("val_loss", "error_rate", "perplexity", "val_acc", "f1", "bleu")] == \
        ["min", "min", "min", "max", "max", "max"]
    s = summarize([{"name": "loss", "value": v, "epoch": e} for e, v in enumerate([3, 1, 2])]
                  + [{"name": "acc", "value": v, "epoch": e} for e, v in enumerate([0.1, 0.5, 0.4])]
                  + [{"name": "note", "value": "x", "epoch": 0}, {"name": "loss", "value": 0.0, "epoch": None}])
    assert s["loss"]["best"] == {"value": 1, "epoch": 1, "step": None} and s["loss"]["final"]["value"] == 2
    assert s["acc"]["best"]["value"] == 0.5 and "note" not in s
