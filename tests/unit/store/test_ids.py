"""flor.store.ids: the grammar of every identifier and key read from a store (issue #10: names
from a store never escape it).
"""

from __future__ import annotations

import pytest

from flor.store.hashing import hash_bytes
from flor.store.ids import HASH_HEX_LEN, bad_key_reason, is_blob_hash, is_checkpoint_file, is_replay_id, is_run_id

# -- identifier grammars --------------------------------------------------------------------------

@pytest.mark.parametrize("check, good, bad", [
    (is_blob_hash, ["0" * HASH_HEX_LEN, hash_bytes(b"x")],
     ["../../../../etc/passwd", "A" * HASH_HEX_LEN, "0" * (HASH_HEX_LEN - 1), "0" * (HASH_HEX_LEN + 1), None, 7,
      "0" * (HASH_HEX_LEN - 2) + "/x"]),
    (is_run_id, ["20261130T050012.123456-1a2b3c", "r1"], ["..", ".", "../x", "a/b", "a\\b", "", "a\0b", "-x", "a..b"]),
    (is_checkpoint_file, ["0.json", "12.json", "3-1.json", "outside.json", "outside-2.json"],
     ["../0.json", "03.json", "+3.json", "3-0.json", "٣.json", "3.json.bak", "x.json", ".json"]),
    (is_replay_id, ["20261201T0700001a2b", "my-replay.1"], ["..", "../x", "a/b", "", "x" * 65]),
])
def test_identifier_grammars(check, good, bad) -> None:
    assert all(check(g) for g in good), [g for g in good if not check(g)]
    assert not any(check(b) for b in bad), [b for b in bad if check(b)]


@pytest.mark.parametrize("key, reason", [
    ("../x", "a '..' segment"), ("runs/r/../../../x", "a '..' segment"), ("/etc/passwd", "an absolute path"),
    ("runs\\..\\x", "a backslash"), ("runs/r\0/x", "a NUL byte"), ("runs//x", "an empty segment"),
    ("runs/r/", "an empty segment"), ("runs/./x", "a '.' segment"), ("", "an empty key"), ("C:/x", "a drive letter"),
    ("runs/r/run.json", None),
])
def test_key_grammar(key: str, reason: str | None) -> None:
    assert bad_key_reason(key) == reason
