"""flor.runinfo: what a recording notes of its machine (here: the load of other processes)."""

from __future__ import annotations

import hashlib
import threading
import time

import flor.runinfo as runinfo


def test_the_load_of_other_processes_leaves_out_this_processs_own_running_threads(monkeypatch):
    """A recording read 1-2 busy cores on an idle machine: its own OpenMP threads, left spinning after
    torch's last parallel region, were counted as other processes' load, and its timings were then
    taken as slowed by it (the first ``--plan`` of a run read 0.72 of the launch)."""
    data, stop = b"x" * (16 << 20), threading.Event()

    def busy() -> None:
        while not stop.is_set():
            hashlib.sha256(data).digest()  # releases the GIL: both threads run at once

    threads = [threading.Thread(target=busy) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.05)
        assert max(runinfo.own_running() for _ in range(20)) >= 3  # this reader and the two hashing threads
    finally:
        stop.set()
        for t in threads:
            t.join()
    # /proc/loadavg's running tasks less this process's own
    monkeypatch.setattr(runinfo, "own_running", lambda: 3)
    monkeypatch.setattr(runinfo.Path, "read_text", lambda self, *a, **k: "0.50 0.40 0.30 5/321 999")
    assert runinfo.busy_cores() == 2.0 and runinfo.busy_cores(samples=3, interval=0.0) == 2.0
    monkeypatch.setattr(runinfo, "own_running", lambda: 9)  # more of our own than the count (read apart)
    assert runinfo.busy_cores() == 0.0
