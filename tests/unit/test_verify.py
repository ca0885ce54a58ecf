"""flor.verify: a replay's logged values compared with the recording's: by record key (an int
and a float step apart), values by number.
"""

from __future__ import annotations

from flor.logs import record_key, same_value
from flor.verify import compare_logs


def test_verification_keys_int_and_float_steps_apart_and_values_by_number():
    recorded = [{"name": "loss", "value": 1, "epoch": 0, "step": 3, "k": 0},
                {"name": "loss", "value": float("nan"), "epoch": 1, "step": 3, "k": 0},
                {"name": "acc", "value": 0.5, "epoch": 0, "step": None, "k": 0}]
    replayed = [{"name": "loss", "value": 1.0, "epoch": 0, "step": 3, "k": 0},  # equal: 1 == 1.0
                {"name": "loss", "value": float("nan"), "epoch": 1, "step": 3, "k": 0},  # NaN equals NaN
                {"name": "gn", "value": 2.0, "epoch": 0, "step": 3.0, "k": 0},
                {"name": "acc", "value": 0.5, "epoch": 0, "step": 0.0, "k": 0},  # step 0.0 is not None
                {"name": "acc", "value": 0.25, "epoch": 0, "step": None, "k": 1}]  # a second occurrence
    shared, bad, hindsight = compare_logs(recorded, replayed, key=record_key, same=same_value)
    assert (shared, bad, hindsight) == (2, [], ["acc", "gn"])
    shared, bad, _ = compare_logs(recorded, [dict(replayed[0], value=2)], key=record_key, same=same_value)
    assert shared == 1 and bad == [{"name": "loss", "epoch": 0, "step": 3, "recorded": 1, "replayed": 2}]
