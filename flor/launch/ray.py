"""Ray as the engine of ``flor replay``: one Ray task per segment, placed by Ray.

``flor replay NAME --ray [ADDRESS] -- python train.py ARGS`` plans the segments exactly as
on one machine (same ``flor.plan``, same replay id, same resuming), then submits one task
per segment that still has to run. A task asks Ray for one GPU (``num_gpus=1``) when the
cluster has GPUs, else for the recorded torch thread count in CPUs, and runs the training
command as a subprocess with the worker's ``FLOR_*`` variables (Ray's ``CUDA_VISIBLE_DEVICES``
for its GPU). Every worker writes its own files under ``FLOR_HOME``, which must therefore be
a filesystem all nodes share (or replay from an S3 spool with ``FLOR_SPOOL``); the launcher
merges them as it does for local workers.

Needs ``pip install 'flor[ray]'``; ``ray.init`` joins ``ADDRESS`` (or ``RAY_ADDRESS``), else
starts a local Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, TextIO

from ..errors import ConfigError
from .launcher import Launch
from .workers import WorkerState

__all__ = ["run_ray"]


def _run_worker(index: int, command: list[str], env: dict[str, str], cwd: str, gpus: int) -> tuple[int, list[str]]:
    """The body of one Ray task: run one replay worker, stream its output, return (status, last lines)."""
    import ray

    if gpus:
        env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in ray.get_gpu_ids())}
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, errors="replace")
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip("\n")])[-15:]
        print(f"[w{index}] {line}", end="", flush=True)
    return proc.wait(), tail


def run_ray(launch: Launch, address: str | None, *, err: TextIO = sys.stderr) -> int:
    """Run ``launch``'s pending workers as Ray tasks; the exit status for the CLI."""
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--ray needs Ray: pip install 'flor[ray]' (or pip install ray)") from exc
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=True,
                 logging_level="ERROR", configure_logging=True)
    gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
    task = ray.remote(_run_worker).options(num_gpus=gpus, num_cpus=0 if gpus else launch.estimate.threads,
                                           max_retries=0)
    pending = launch.prepare()
    refs: dict[Any, WorkerState] = {}
    for s in pending:
        s.spawned = time.time()
        refs[task.remote(s.index, launch.command, launch.env(s.index), os.getcwd(), gpus)] = s
    while refs:
        ready, _ = ray.wait(list(refs), timeout=0.5)
        for ref in ready:
            s = refs.pop(ref)
            s.exited = time.time()
            try:
                s.rc, tail = ray.get(ref)
                s.tail.extend(tail)
            except Exception as exc:  # noqa: BLE001 - a lost node or task is that worker's failure
                s.rc = -1
                s.tail.append(f"Ray task failed: {exc}")
        for s in pending:
            if s.rc is None:
                s.read_marks(launch.marks(s))
        launch.show_progress()
    return launch.conclude(pending)
