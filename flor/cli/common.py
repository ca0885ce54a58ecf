"""What the subcommand modules share."""

from __future__ import annotations

import argparse
from typing import Any

from .._fmt import human_size, printable

__all__ = ["InertStream", "human_size", "subcommand"]


def subcommand(sub: Any, name: str, help: str, epilog: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog="examples:\n" + epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


class InertStream:
    """A text stream whose writes reach the terminal inert: every string a command prints may come
    from a store (run ids, hyperparameters, argv, metric names, notes), which anyone may write, so
    control characters (an OSC 52 clipboard write, a CR that overwrites a line with a fake
    "replay verified exact") are written as visible escapes. With ``keep_cr`` a write may start
    with carriage returns: a progress bar redraws its line that way (tqdm writes ``"\\r" + bar``
    at once); one anywhere else is escaped. Everything else is the wrapped stream's."""

    def __init__(self, stream: Any, *, keep_cr: bool = False) -> None:
        self._stream = stream
        self._keep_cr = keep_cr

    def write(self, text: str) -> int:
        lead = len(text) - len(text.lstrip("\r")) if self._keep_cr else 0
        return self._stream.write(text[:lead] + printable(text[lead:]))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
