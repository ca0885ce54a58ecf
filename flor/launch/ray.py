"""The ``ray`` executor of ``flor replay``: one Ray task per segment, placed by Ray.

``flor replay NAME --ray [ADDRESS] -- python train.py ARGS`` plans the segments exactly as
on one machine (same ``flor.plan``, same replay id, same resuming), then submits one task
per segment that still has to run. A task asks Ray for one GPU (``num_gpus=1``) when the
cluster has GPUs, else for the recorded torch thread count in CPUs, and runs the training
command as a subprocess with the worker's ``FLOR_*`` variables (Ray's ``CUDA_VISIBLE_DEVICES``
for its GPU). The task streams the worker's lines back to the launcher (a Ray generator
task), which prints them as it does for local workers. Every worker writes its own files
under ``FLOR_HOME``, which must therefore be a filesystem all nodes share (or replay from an
S3 spool with ``FLOR_SPOOL``); the launcher merges them as it does for local workers.

Needs Ray (``pip install ray``, or ``pip install -e '.[ray]'`` in flor's checkout);
``ray.init`` joins ``ADDRESS`` (or ``RAY_ADDRESS``), else starts a local Ray.

>>> executor = RayExecutor("ray://head:10001")  # connects only when the launch opens it
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from typing import Any, Iterator, Mapping, Sequence

from ..errors import ConfigError
from .executor import Worker

__all__ = ["RayExecutor", "RayWorker"]

_FAILED = -1  # the status of a task Ray lost (a node died, the task was cancelled)


def _run_worker(command: list[str], env: dict[str, str], cwd: str, gpus: int) -> Iterator[str | int]:
    """The body of one Ray task: run one replay worker; yield its lines, then its exit status."""
    import ray

    if gpus:
        env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in ray.get_gpu_ids())}
    from .output import read_lines

    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None  # piped above
    for line in read_lines(proc.stdout):  # noqa: UP028 - not `yield from`: Ray's generator protocol would reach send()
        yield line
    yield proc.wait()


class RayWorker:
    """A Ray generator task seen as a worker: its lines arrive as the task yields them."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream  # ray.ObjectRefGenerator
        self._rc: int | None = None
        self._ended = threading.Event()

    def lines(self) -> Iterator[str]:
        import ray

        rc = _FAILED
        try:
            for ref in self.stream:
                item = ray.get(ref)
                if isinstance(item, int):
                    rc = item
                else:
                    yield item
        except Exception as exc:  # noqa: BLE001 - a lost node or task is that worker's failure
            yield f"Ray task failed: {exc}\n"
        finally:
            self._rc = rc
            self._ended.set()

    def poll(self) -> int | None:
        return self._rc if self._ended.is_set() else None

    def stop(self) -> None:
        import ray

        try:
            ray.cancel(self.stream, force=True)
        except Exception:  # noqa: BLE001 - already finished, or a Ray without cancel for streams
            pass

    def wait(self) -> int:
        self._ended.wait(timeout=30)  # the output thread ends the stream; a lost one counts as failed
        return self._rc if self._rc is not None else _FAILED


class RayExecutor:
    """Runs every worker as a Ray task of the cluster at ``address`` (None: ``RAY_ADDRESS``, else
    a local Ray)."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        self.gpus = 0

    def open(self) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("--ray needs Ray: pip install ray"
                              " (or pip install -e '.[ray]' in flor's checkout)") from exc
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=True,
                     logging_level=logging.ERROR, configure_logging=True)
        self.gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0

    def start(self, index: int, command: Sequence[str], env: Mapping[str, str], *, threads: int) -> Worker:
        import ray

        task = ray.remote(_run_worker).options(num_gpus=self.gpus, num_cpus=0 if self.gpus else threads,
                                               max_retries=0, name=f"flor-w{index}")
        return RayWorker(task.remote(list(command), dict(env), os.getcwd(), self.gpus))
