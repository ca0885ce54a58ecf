"""How flor writes sizes, epoch ranges and durations for people, and its progress bar."""

from __future__ import annotations

from typing import Any, Sequence

from .errors import printable

__all__ = ["clock", "human_size", "listed", "printable", "progress", "span"]


def human_size(n: float, *, base: int = 1024) -> str:
    """``512 B``, ``12.3 KB``, ``4.0 MB``: one decimal, units of ``base`` (1024, or 1000 as
    S3 consoles count).

    >>> human_size(1536)
    '1.5 KB'
    >>> human_size(1500, base=1000)
    '1.5 KB'
    """
    for unit in ("B", "KB", "MB", "GB"):
        if n < base or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= base
    return f"{n:.1f} GB"  # pragma: no cover


def listed(names: Sequence[str], most: int) -> str:
    """Names for a message: the first ``most`` of them, then how many more.

    >>> listed(["a", "b", "c"], 2), listed(["a"], 2)
    ('a, b and 1 more', 'a')
    """
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def span(r: range | Sequence[int] | None) -> str:
    """An epoch range as people write it.

    >>> span(range(3, 8)), span([4]), span(None)
    ('3-7', '4', 'none')
    """
    if r is None or len(r) == 0:
        return "none"
    return f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}"


def clock(seconds: float) -> str:
    """A duration as a clock reads: ``m:ss`` or ``h:mm:ss``.

    >>> clock(75), clock(3725)
    ('1:15', '1:02:05')
    """
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


def progress(total: float | None, label: str, *, stream: Any = None, unit: str = "it",
             unit_scale: bool = False, bar_format: str | None = None) -> Any:
    """tqdm's bar on ``stream`` (stderr by default), drawn only on a terminal; ``bar_format`` is
    tqdm's (e.g. ``"{desc}: |{bar}| {n_fmt}/{total_fmt} epochs{postfix}"`` with a postfix
    the caller sets and no tqdm ETA)."""
    import sys

    from tqdm import tqdm

    stream = stream if stream is not None else sys.stderr
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return tqdm(total=total, desc=f"flor: {label}", file=stream, unit=unit, unit_scale=unit_scale,
                bar_format=bar_format, disable=not tty, leave=False, dynamic_ncols=True)
