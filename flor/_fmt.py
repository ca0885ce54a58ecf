"""How flor writes sizes, epoch ranges and durations for people, and its progress bar."""

from __future__ import annotations

import re
from typing import Any, Sequence

__all__ = ["clock", "human_size", "listed", "printable", "progress", "span"]


#: C0 controls but tab and newline, DEL, and C1 controls (CSI, OSC...): what a terminal acts on
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object, *, newlines: bool = True) -> str:
    r"""``text`` with every character a terminal would act on (ESC sequences such as OSC 52
    clipboard writes, a CR that overwrites the line, bidirectional overrides) written as a
    visible escape: what a store says is shown, never obeyed. With ``newlines=False`` a newline
    is escaped too (a name printed on one line must stay on it).

    >>> printable("loss\x1b]52;c;aGk=\x07\rflor: replay verified exact")
    'loss\\x1b]52;c;aGk=\\x07\\rflor: replay verified exact'
    """
    text = str(text)
    pattern = _CONTROL if newlines else _CONTROL_NL
    if not pattern.search(text):
        return text
    return pattern.sub(_escape, text)


_CONTROL_NL = re.compile(_CONTROL.pattern[:-1] + "\n]")


def _escape(m: re.Match) -> str:
    c = m.group()
    return {"\r": "\\r", "\n": "\\n"}.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


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
