"""``SkipBlock``: memoize the expensive body of each epoch by checkpointing its outputs."""

from __future__ import annotations

from typing import Any

from .session import as_result, current

__all__ = ["SkipBlock"]


class SkipBlock:
    """A block of code whose effects on the objects given to ``end`` are checkpointed.

    >>> import flor
    >>> x = [0]
    >>> if flor.SkipBlock.step_into("work"):
    ...     x[0] += 1
    >>> x = flor.SkipBlock.end(x)
    """

    @staticmethod
    def step_into(name: str, probed: bool = False) -> bool:
        """Whether to run the block body: always while recording; on replay only when the
        block is ``probed`` (logging was added inside it) or has no checkpoint."""
        session = current()
        if session is None:
            return True
        return session.step_into(name, probed)

    @staticmethod
    def end(*objs: Any) -> Any:
        """Capture (record) or restore (replay) the state of ``objs``; return them.

        Returns the single object for one argument, else a tuple in the same order, so
        immutable values (step counters) can be rebound: ``net, step = SkipBlock.end(net, step)``.
        """
        session = current()
        if session is None:
            return as_result(objs)
        return session.end(objs)
