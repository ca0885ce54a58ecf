"""A sample of the reliability benchmark: kill -9 at 6 random instants of a recording.

``benchmarks/reliability.py`` runs 100 trials and the other faults by hand; here 6 trials
(seeded differently on every run, so CI keeps sampling new instants) must leave 0 unreadable
manifests, 0 missing or corrupt blobs, and exact replays of what was committed.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "reliability.py"


def test_kill9_at_random_instants_loses_nothing(tmp_path):
    out = tmp_path / "reliability.json"
    seed = random.randrange(1 << 30)
    proc = subprocess.run([sys.executable, str(BENCH), "--trials", "6", "--replay-every", "3", "--no-scenarios",
                           "--seed", str(seed), "--out", str(out)], cwd=BENCH.parent, capture_output=True, text=True,
                          timeout=900)
    assert out.exists(), proc.stdout + proc.stderr
    k = json.loads(out.read_text())["kill9"]
    detail = f"seed {seed}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert k["trials"] == 6 and sum(k["killed_in"].values()) == 6, detail
    assert k["unreadable_manifests"] == 0 and k["bad_blobs"] == 0, detail
    assert k["replays"] >= 1 and k["replays_exact"] == k["replays"], detail
    assert k["lost"] == 0 and proc.returncode == 0, detail
