"""The workers' output as ``flor replay`` shows it: lines, not progress-bar redraws.

A worker's tqdm bars redraw themselves with carriage returns (and, nested, with cursor
moves). Read as lines, each redraw would become a line of its own: hundreds a run. Here the
output is split at newlines only, a line keeps only what follows its last ``\\r``, a line that
is left with nothing but a bar is dropped (the launcher's own bar shows the progress), and so
are blank lines. What a worker prints twice to everyone (its notes) is shown once, and its own
verification summary is not shown: the launcher prints one summary merged from all workers
(each worker's stays in its files).

>>> view = WorkerOutput("20261130T0500")
>>> view.show("\\repochs:  50%|#####     | 4/8 [00:01<00:01, 3.9it/s]\\repoch 3 acc 0.9\\n")
'epoch 3 acc 0.9'
>>> view.show("\\repoch 4:  6%|6         | 1/16 [00:00<00:00, 532.75it/s]\\x1b[A\\n") is None
True
"""

from __future__ import annotations

import io
import re
from typing import IO, Iterator

__all__ = ["WorkerOutput", "read_lines"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# the end of a tqdm bar: "| 4/8 [00:01<00:01, 3.9it/s]" or "5it [00:00, 82.4it/s, loss=0.3]"
_BAR = re.compile(r"^.*\[\d+:\d\d(?::\d\d)?(?:<[^\],]*)?, [^\]]*\]")
_SUMMARY_END = re.compile(r"^flor: replay (verified exact|checked nothing|NOT EXACT|DIVERGED|FAILED)\b")


def read_lines(stream: IO[bytes]) -> Iterator[str]:
    """Lines of a worker's output, split at ``\\n`` only (a ``\\r`` stays inside its line)."""
    yield from io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="\n")


def clean(line: str) -> str | None:
    """What a terminal would show of ``line`` once its redraws are done, or None when that is
    only a progress bar or nothing."""
    text = _ANSI.sub("", line.rstrip("\n"))
    if "\r" in text:
        text = text.rstrip("\r").rsplit("\r", 1)[-1]
        text = _BAR.sub("", text, count=1)  # a bar, and what was printed right after it
    return text if text.strip() else None


class WorkerOutput:
    """What the launcher shows of one worker's lines (see the module docstring); ``said`` is
    shared by the workers of one launch, so a note they all print is shown once."""

    def __init__(self, replay_id: str, said: set[str] | None = None) -> None:
        self._summary_start = f"flor: replay {replay_id} of "
        self._in_summary = False
        self.said = said if said is not None else set()

    def show(self, line: str) -> str | None:
        """The text to show for ``line`` (without its newline), or None."""
        text = clean(line)
        if text is None:
            return None
        if text.startswith(self._summary_start) and ", worker " in text:
            self._in_summary = True  # this worker's own summary: the merged one follows
        if self._in_summary:
            self._in_summary = not _SUMMARY_END.match(text)
            return None
        if text.startswith("flor: "):
            if text in self.said:
                return None
            self.said.add(text)
        return text

    def notes(self) -> set[str]:
        """The notes shown so far (``flor: `` taken off), so the merged summary need not repeat them."""
        return {t[len("flor: "):] for t in self.said}
