"""Where the workers of ``flor replay`` run: the interface that the launcher drives.

An :class:`Executor` starts one worker (a training command with its environment) and hands back
a :class:`Worker`: the lines it prints, whether it has ended, and a way to stop it. The launcher
owns everything else (plan, resuming, progress, the merged summary), so a new place to run
workers is one small class. Two exist: ``local`` (processes of this machine) and ``ray`` (one
Ray task per segment).

>>> from flor.launch.local import LocalExecutor
>>> isinstance(LocalExecutor(), Executor)
True
"""

from __future__ import annotations

from typing import Iterator, Mapping, Protocol, Sequence, runtime_checkable

__all__ = ["Executor", "Worker"]


@runtime_checkable
class Worker(Protocol):
    """One started replay worker."""

    def lines(self) -> Iterator[str]:
        """Its output (stdout and stderr together), line by line, until it ends; read by one thread."""
        ...

    def poll(self) -> int | None:
        """Its exit status once it has ended (negative: killed by that signal), else None."""
        ...

    def stop(self) -> None:
        """Ask it to end (Ctrl-C in the launcher); called again, end it at once; :meth:`wait` then
        gives its status."""
        ...

    def wait(self) -> int:
        """Block until it has ended; its exit status."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Runs replay workers somewhere."""

    def open(self) -> None:
        """Get ready (connect to a cluster...) before the launch announces itself; may raise ConfigError."""
        ...

    def start(self, index: int, command: Sequence[str], env: Mapping[str, str], *, threads: int) -> Worker:
        """Start worker ``index``: ``command`` with exactly ``env``; ``threads`` is the CPU count it uses."""
        ...
