"""The ``local`` executor of ``flor replay``: each worker a subprocess of this machine.

>>> import sys
>>> w = LocalExecutor().start(0, [sys.executable, "-c", "print('hi')"], {}, threads=1)
>>> list(w.lines()), w.wait()
(['hi\\n'], 0)
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from typing import Callable, Iterator, Mapping, Sequence

from ..errors import ConfigError
from .executor import Worker
from .output import read_lines

__all__ = ["LocalExecutor", "LocalWorker"]


_PR_SET_PDEATHSIG = 1


def _end_with(launcher: int) -> Callable[[], None] | None:
    """What a worker runs before its command, on Linux: SIGTERM it when the launcher dies (a
    SIGKILL, an out-of-memory kill), as Ctrl-C would stop it; else it would replay on, unwatched,
    beside the workers of the launch that resumes it. Elsewhere nothing."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def end_with_launcher() -> None:  # in the child, between fork and exec: one system call
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != launcher:  # it died before the call
            os._exit(1)

    return end_with_launcher


class LocalWorker:
    """A worker process; its stderr joins its stdout so the lines keep their order."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str]) -> None:
        self._stopping = False  # stop() asked once already
        try:
            self.proc = subprocess.Popen(list(command), env=dict(env), stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, preexec_fn=_end_with(os.getpid()))
        except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
            prog = command[0] if command else ""
            why = "not found" if isinstance(exc, FileNotFoundError) else f"cannot be run ({exc.strerror})"
            raise ConfigError(f"command {why}: {prog!r}; check the command after --, "
                              "e.g. flor replay NAME -- python train.py") from None

    def lines(self) -> Iterator[str]:
        assert self.proc.stdout is not None  # piped above
        yield from read_lines(self.proc.stdout)  # a progress bar's \r stays inside its line

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        if self._stopping:  # asked before and still running: stuck, or ignoring SIGTERM
            self.proc.kill()
            return
        self._stopping = True
        self.proc.terminate()
        try:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped worker (SIGSTOP, a busy node's Ctrl-Z) gets it now
        except OSError:
            pass  # ended meanwhile

    def wait(self) -> int:
        return self.proc.wait()


class LocalExecutor:
    """Runs every worker as a process of this machine (placement is in the environment the
    launcher gives: ``CUDA_VISIBLE_DEVICES``, ``OMP_NUM_THREADS``)."""

    def open(self) -> None:
        pass  # nothing to connect to

    def start(self, index: int, command: Sequence[str], env: Mapping[str, str], *, threads: int) -> Worker:
        return LocalWorker(command, env)
