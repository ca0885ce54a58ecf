"""flor.watch.variables: the reader of block-state.jsonl keeps only well-formed lines
(``e2e/test_block_vars.py`` replays real scripts).
"""

from __future__ import annotations

import json


def test_block_state_reader_keeps_only_well_formed_lines(tmp_path):
    from flor.watch.variables import read_block_state

    path = tmp_path / "block-state.jsonl"
    path.write_text("\n".join([
        json.dumps({"epoch": 0, "block": "b", "occ": 0, "vars": {"x": 1, "__class__": 2, "a b": 3}}),
        json.dumps({"epoch": None, "block": "pre", "occ": 0, "vars": {"n": 5}}),
        json.dumps({"epoch": True, "block": "b", "occ": 0, "vars": {"x": 9}}),
        json.dumps({"epoch": 1, "block": "b", "occ": 0.5, "vars": {"x": 9}}),
        json.dumps({"epoch": 0, "block": "b", "occ": 0, "vars": {"x": 2}}),  # a resumed recording: the last wins
        json.dumps({"epoch": 2, "block": "b", "occ": 0, "vars": {}, "globals": {"step": 3, "__name__": "x"}}),
        json.dumps({"epoch": 3, "block": "b", "occ": 0, "vars": {}, "globals": ["step"]}),
        json.dumps({"epoch": 4, "block": "b", "occ": 0, "vars": {},
                    "attrs": {"self": {"step": 1, "__dict__": 2, "a.b": 3, "a.__class__": 4, "a..b": 5, "a.b.c": 6, ".a": 7},
                              "x y": {"z": 1}, "o": [1], "p": {}}}),
        json.dumps({"epoch": 5, "block": "b", "occ": 0, "vars": {}, "attrs": [["self", "step"]]}),
        json.dumps({"epoch": 6, "block": "b", "occ": 0, "vars": {},  # names and counts only: compared, never set
                    "outside": {"end() object 0: 1.num_batches_tracked": 2, "x": "2", "y": 1.5, "z" * 500: 1}}),
        json.dumps({"epoch": 7, "block": "b", "occ": 0, "vars": {}, "outside": ["x"]}),
        "{", "[]",
    ]) + "\n")
    none = {"globals": {}, "attrs": {}, "outside": {}}
    assert read_block_state(path) == {(0, "b", 0): {**none, "vars": {"x": 2}},
                                      (None, "pre", 0): {**none, "vars": {"n": 5}},
                                      (2, "b", 0): {**none, "vars": {}, "globals": {"step": 3}},
                                      (4, "b", 0): {**none, "vars": {}, "attrs": {"self": {"step": 1, "a.b": 3}, "p": {}}},
                                      (6, "b", 0): {**none, "vars": {}, "outside": {"end() object 0: 1.num_batches_tracked": 2}},
                                      (7, "b", 0): {**none, "vars": {}}}
    assert read_block_state(tmp_path / "missing.jsonl") == {}
