"""What the subcommand modules share."""

from __future__ import annotations

import argparse
from typing import Any


def subcommand(sub: Any, name: str, help: str, epilog: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog="examples:\n" + epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter)



def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"
