"""Best and final values of logged metrics, and which way is better.

The recording keeps this summary in ``run.json`` under ``metrics`` when it ends, so a run's
results can be read without its logs; ``flor show`` computes the same from the logs,
hindsight values included.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

__all__ = ["MetricTracker", "goal_of", "summarize"]

# Names of quantities that are better when lower. Anything else (accuracy, F1, BLEU,
# reward...) is taken to be better when higher; --goal overrides the guess.
_LOWER_RE = re.compile(r"loss|err|perplex|ppl|mse|mae|nll|wer|cer|regret|cost|time",
                       re.IGNORECASE)


def goal_of(name: str) -> str:
    """``"min"`` for names that look like losses or errors, else ``"max"``.

    >>> goal_of("val_loss"), goal_of("val_acc")
    ('min', 'max')
    """
    return "min" if _LOWER_RE.search(name) else "max"


def number(value: Any) -> float | None:
    """A finite number (bools excluded), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class MetricTracker:
    """Follow log records as they are written; keep each numeric name's final and best value.

    Only values logged inside ``flor.it``'s loop count: they have an epoch.
    """

    def __init__(self) -> None:
        self._metrics: dict[str, dict[str, Any]] = {}

    def add(self, records: Iterable[dict]) -> None:
        for rec in records:
            if rec.get("epoch") is None:
                continue
            value = number(rec.get("value"))
            if value is None:
                continue
            name = rec["name"]
            m = self._metrics.get(name)
            point = {"value": rec["value"], "epoch": rec["epoch"], "step": rec.get("step")}
            if m is None:
                m = self._metrics[name] = {"goal": goal_of(name), "final": point, "best": point, "n": 0}
            m["n"] += 1
            m["final"] = point
            best = m["best"]["value"]
            if (value < best) if m["goal"] == "min" else (value > best):
                m["best"] = point

    def summary(self) -> dict[str, dict[str, Any]]:
        """``{name: {goal, n, final: {value, epoch, step}, best: {...}}}``."""
        return {k: dict(v) for k, v in sorted(self._metrics.items())}


def summarize(records: Iterable[dict]) -> dict[str, dict[str, Any]]:
    """The summary of records already merged (newest value per epoch and step), in order."""
    tracker = MetricTracker()
    tracker.add(records)
    return tracker.summary()
