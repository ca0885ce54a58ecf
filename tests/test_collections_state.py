"""State in ``collections`` containers (``scripts/collections_state.py``): a ``deque`` of recent
losses the epoch loop appends to, a ``Counter`` the block counts in.

Both went unnamed. The outer-loop state looked at the size of builtin containers only, so a
worker that starts mid-run left the deque empty, unnamed, and logged a mean of recent losses
over one epoch where a full run averages three (verified exact); the recording's check for a
container a block resizes but ``end()`` is not given matched exact types, and a Counter is a
dict subclass. A worker now names the deque it cannot restore, and the recording the Counter.
"""

from __future__ import annotations

from conftest import Runner


def test_the_recording_names_a_counter_the_block_changed_and_a_worker_the_deque(tmp_path):
    r = Runner(tmp_path)
    script = r.script("collections_state.py")
    proc = r.run(script, "--flor", "c")
    assert "SkipBlock.end('train') was not given `seen` (a Counter the block changed from 0 to 1 items)" \
        in proc.stderr, proc.stderr
    proc = r.run(script, "--flor", "c", "--replay_flor", "1/2", check=False)
    assert "that this worker (starting at epoch 1) cannot restore: recent, seen." in proc.stderr, proc.stderr
    assert proc.returncode == 3 and "DIVERGED log 'recent' at epoch 2" in proc.stderr  # logged in the recording too
