"""A replay worker that starts after the loop grew the model names ``--flor_strong``
(``scripts/grow_head.py``), and with it replays exactly.

It stopped with "size mismatch for 2.weight ... was the object built differently from the
recording?", which points at the script, not at the worker that skipped the epoch whose loop
code grew the head.
"""

from __future__ import annotations

from helpers import Runner, values

HINDSIGHT = {"    # HINDSIGHT": '    flor.log("head", net[2].weight.norm().item())'}


def test_a_worker_after_the_model_grew_names_flor_strong_and_replays_with_it(tmp_path):
    r = Runner(tmp_path)
    r.run(r.script("grow_head.py"), "--flor", "g")
    edited = r.script("grow_head.py", HINDSIGHT, dest="hindsight.py")
    r.run(edited, "--flor", "full")
    proc = r.run(edited, "--flor", "g", "--replay_flor=2/3", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "size mismatch" in proc.stderr and "this worker starts at epoch 3 without running the loop's code" \
        in proc.stderr and "replay with --flor_strong" in proc.stderr, proc.stderr
    proc = r.run(edited, "--flor", "g", "--replay_flor=2/3", "--flor_strong")
    assert "replay verified exact" in proc.stderr, proc.stderr
    full = values(r.logs("full"), "record")
    got = values(r.logs("g"), "replay")
    assert got == {k: v for k, v in full.items() if k[1] >= 4} and len(got) == 4
