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


# -- the verdict is the sum of its conditions ------------------------------------------------

import pytest  # noqa: E402

from flor.verify import CONDITIONS, BlockEvent, Summary  # noqa: E402


def _summary(*notes: str, lenient: bool = False) -> Summary:
    s = Summary(header="flor: replay r", notes=list(notes), lenient=lenient)
    s.events.append(BlockEvent(0, "train", 0, "restored"))
    return s


@pytest.mark.parametrize("notes, verdict, status", [
    ((), "verified exact", 0),
    (("FL320 outer-loop variables restored as recorded",), "verified exact", 0),  # a note, not a condition
    (("FL325 code outside the blocks drew from the torch random generator",), "not exact", 3),
    (("FL330 3 of this worker's logged values could not be written",), "not exact", 1),
    (("FL330 values not written", "FL338 the hindsight flor.log('x', ...) never ran"), "not exact", 3),
])
def test_every_condition_is_named_with_its_code_and_sets_the_exit_status(notes, verdict, status):
    s = _summary(*notes)
    out = s.to_json()
    assert out["verdict"] == verdict and s.exit_status == status
    codes = [c["code"] for c in out["conditions"]]
    assert codes == [n.split()[0] for n in notes if n.split()[0] in CONDITIONS]
    last = s.render().splitlines()[-1]
    if codes:
        assert last.startswith("flor: replay NOT EXACT") and all(c in last for c in codes), last
        assert last.endswith(f"exit status {status} (--flor_lenient keeps 0)")
    else:
        assert last.startswith("flor: replay verified exact") and "not restored" not in last
    if codes:
        assert _summary(*notes, lenient=True).exit_status == 0


def test_state_named_by_no_note_still_qualifies_the_verdict():
    s = _summary()
    s.unrestored, s.outside = ["checkpoint"], ["end() object 0: running_mean"]
    assert s.conditions == ["FL337", "FL328"] and s.to_json()["verdict"] == "not exact"
