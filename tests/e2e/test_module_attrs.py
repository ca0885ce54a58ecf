"""The recording names a plain attribute of a module given to ``end()`` that the block changes
(``scripts/module_attrs.py``).

A module is checkpointed through its state_dict, which holds parameters and buffers only:
``net.temperature *= 0.9`` inside the block recorded silently, and a replay that restored the
block read the attribute as the script built it, ending "verified exact".
"""

from __future__ import annotations

from helpers import Runner, said, values

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("et", net.epochs_trained)\n    flor.log("calls", net.fc.calls)'}


def test_the_recording_names_a_module_attribute_the_block_changed(tmp_path):
    r = Runner(tmp_path)
    proc = r.run(r.script("module_attrs.py"), "--flor", "m")
    for attr in ("net.temperature", "net.epochs_trained"):
        assert f"the block changed `{attr}`, a plain attribute of a module given to end()" in proc.stderr, proc.stderr
    assert not said(proc.stderr, "FL206", "`net.seen`") and not said(proc.stderr, "FL206", "`net.fc")  # a buffer is in the state_dict
    assert proc.stderr.count("a plain attribute of a module") == 2  # once a block
    edited = r.script("module_attrs.py", HINDSIGHT, dest="hindsight.py")
    r.run(edited, "--flor", "full")  # the full re-execution
    r.run(edited, "--flor", "m", "--replay_flor")

    def series(name: str, source: str, key: str) -> list:
        return [values(r.logs(name), source)[(key, e, None)] for e in range(3)]

    assert series("full", "record", "et") == [1, 2, 3]
    assert series("m", "replay", "et") == [0, 0, 0]  # why the warning matters
    assert series("m", "replay", "seen") == series("full", "record", "seen")  # the buffer is restored
    assert series("m", "replay", "calls") == series("full", "record", "calls") == [1, 2, 3]  # the extra state too
