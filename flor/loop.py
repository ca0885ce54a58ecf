"""``flor.it``: the epoch loop, recorded or replayed along the plan."""

from __future__ import annotations

from typing import Iterable, TypeVar

from .session import current

__all__ = ["it"]

T = TypeVar("T")


def it(iterable: Iterable[T]) -> Iterable[T]:
    """Wrap the outer (epoch) loop.

    Inert, it returns ``iterable`` itself. Recording, it numbers the epochs. Replaying, it
    skips to the epochs this worker initializes from and stops after its segment.

    >>> for epoch in it(range(3)):
    ...     pass
    """
    session = current()
    if session is None:
        return iterable
    return session.iterate(iterable)
