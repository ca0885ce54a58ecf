"""flor.watch.loop: the loop's state written back into a running frame's locals, and
logs/state.jsonl (read from a store) taken line by line, damaged lines skipped.
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
    """state.jsonl is read from a store: what it says is unchanged is only ever names."""
    from flor.watch.loop import read_state

    path = tmp_path / "state.jsonl"
    lines = [{"epoch": 0, "vars": {"a": 1}, "unchanged": "a"},  # not a list: a damaged line, skipped
             {"epoch": 1, "vars": {"a": 1, "b": 2}, "unchanged": [1, "b", None, {"x": 1}]},
             {"epoch": 2, "vars": {"a": 1}}]  # no field: damaged too (run.json format 2 always writes it)
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    state = read_state(path).loop
    assert 0 not in state and 2 not in state and state[1]["unchanged"] == ["b"]



def test_the_state_reader_keeps_only_well_formed_lines(tmp_path):
    """logs/state.jsonl is read from a store: the changes outside the blocks are names and counts
    only (compared, never acted on), the loop's lines need an epoch and a dict of values."""
    from flor.watch.loop import read_state

    path = tmp_path / "state.jsonl"
    path.write_text("\n".join([
        json.dumps({"epoch": 0, "block": "b", "occ": 0, "outside": {"x": 1}}),
        json.dumps({"epoch": 0, "block": "b", "occ": 0, "outside": {"x": 2}}),  # a resumed recording: the last wins
        json.dumps({"epoch": None, "block": "pre", "occ": 0, "outside": {"n": 5}}),
        json.dumps({"epoch": True, "block": "b", "occ": 0, "outside": {"x": 9}}),
        json.dumps({"epoch": 1, "block": "b", "occ": 0.5, "outside": {"x": 9}}),
        json.dumps({"epoch": 6, "block": "b", "occ": 0,
                    "outside": {"end() object 0: 1.num_batches_tracked": 2, "x": "2", "y": 1.5, "z" * 500: 1}}),
        json.dumps({"epoch": 7, "block": "b", "occ": 0, "outside": ["x"]}),
        json.dumps({"epoch": 3, "vars": {"a": 1}, "unrestorable": ["b", 2], "unchanged": ["c", 1]}),
        json.dumps({"epoch": 8, "vars": {"a": 1}, "unchanged": "a"}),  # not a list: a damaged line
        json.dumps({"epoch": "4", "vars": {"a": 1}}),
        json.dumps({"epoch": 5, "vars": [1]}),
        "{", "[]",
    ]) + "\n")
    state = read_state(path)
    assert state.outside == {(0, "b", 0): {"x": 2}, (None, "pre", 0): {"n": 5},
                             (6, "b", 0): {"end() object 0: 1.num_batches_tracked": 2}}
    assert state.loop == {3: {"epoch": 3, "vars": {"a": 1}, "unrestorable": ["b"], "unchanged": ["c"]}}
    assert read_state(tmp_path / "missing.jsonl") == ({}, {})

