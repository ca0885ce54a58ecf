"""flor.placement: replay workers placed by Slurm and torchrun variables share a replay id; the
idle cores are read from /proc/stat, leaving out the writer's own time.
"""

from __future__ import annotations

import os
import time

import pytest

from flor.placement import IDLE_WINDOW_S, IdleMeter, cores
from flor.settings import parse


def test_idle_cores_are_read_from_proc_stat_and_leave_out_the_writer(tmp_path):
    stat = tmp_path / "stat"
    cpus = sorted(os.sched_getaffinity(0))

    def write(busy_ticks):
        lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
        lines += [f"cpu{c} {busy_ticks} 0 0 1000 7 0 0 0 0 0" for c in cpus]  # user .. idle iowait ..
        lines += ["cpu999 100000 0 0 0 0 0 0 0 0 0", "intr 1 2"]  # a core this process may not use
        stat.write_text("\n".join(lines) + "\n")

    write(0)
    meter = IdleMeter(path=str(stat))
    time.sleep(IDLE_WINDOW_S + 0.05)
    assert meter.idle() == cores()  # nothing ran
    write(10**6)  # every core busy for far longer than the time between readings
    time.sleep(IDLE_WINDOW_S + 0.05)
    assert meter.idle() == 0.0
    hz = os.sysconf("SC_CLK_TCK")
    write(10**6 + hz)  # one CPU-second on each core ...
    time.sleep(IDLE_WINDOW_S + 0.05)
    assert meter.idle(exclude_s=len(cpus)) == cores()  # ... all of it the writer's own
    write(2 * 10**6)  # busy again, but read too soon after the last reading to tell ...
    assert meter.idle() is None
    time.sleep(IDLE_WINDOW_S + 0.05)
    assert meter.idle() == 0.0  # ... the reading went on: the ticks since the last one count


@pytest.mark.parametrize("env, pid, n, rid", [
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "4",
      "SLURM_ARRAY_JOB_ID": "77"}, 1, 4, "slurm77"),
    ({"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "88", "SLURM_STEP_ID": "1"}, 2, 3, "slurm88.1"),
    ({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "ab/c"}, 1, 2, "tr-ab_c"),
    ({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}, 1, 2, None),
    ({"RANK": "1", "WORLD_SIZE": "2", "FLOR_REPLAY_ID": "mine"}, 1, 2, "mine"),
])
def test_cluster_placement_shares_a_replay_id(env, pid, n, rid):
    s, _ = parse(["t.py", "--flor", "x", "--replay_flor"], env)
    assert (s.pid, s.ngpus, s.replay_id) == (pid, n, rid)
