"""flor.watch.loop: outer-loop state written back into a running frame's locals, and the
unchanged names of an outer-state line (read from a store) checked.
"""

from __future__ import annotations

import json
import sys


def test_locals_are_written_back_into_a_running_frame():
    from flor.watch.loop import LoopFrame

    def loop():
        best, patience, hist = 1.0, 0, [1]
        frame = sys._getframe()
        LoopFrame(frame).restore({"best": 0.25, "patience": 3, "hist": [4, 5]})
        return best, patience, hist

    assert loop() == (0.25, 3, [4, 5])


def test_the_unchanged_names_of_an_outer_state_line_are_checked(tmp_path):
    """outer-state.jsonl is read from a store: what it says is unchanged is only ever names."""
    from flor.watch.loop import read_outer_state

    path = tmp_path / "outer-state.jsonl"
    lines = [{"epoch": 0, "vars": {"a": 1}, "unchanged": "a"},  # not a list: nothing is taken as unchanged
             {"epoch": 1, "vars": {"a": 1, "b": 2}, "unchanged": [1, "b", None, {"x": 1}]},
             {"epoch": 2, "vars": {"a": 1}}]  # an older flor: no field
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert [read_outer_state(path, e)["unchanged"] for e in range(3)] == [[], ["b"], []]
