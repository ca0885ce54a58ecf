"""What the subcommand modules share."""

from __future__ import annotations

import argparse
from typing import Any

from .._fmt import human_size

__all__ = ["human_size", "subcommand"]


def subcommand(sub: Any, name: str, help: str, epilog: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog="examples:\n" + epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)


