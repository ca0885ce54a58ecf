"""The script a replay runs against the one recorded: its edits (logging only, or more) and its
arguments, said as findings."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Callable

from .._files import read_bytes
from ..redact import redact_argv
from ..source.edits import non_logging_changes
from ..source.hindsight import NewLog, new_logs
from ..store.runmeta import RunMeta

__all__ = ["compare_script", "script_sha256"]


def compare_script(meta: RunMeta, run_dir: Path, note: Callable[[str, str], None]) -> tuple[bool, list[NewLog]]:
    """Say how the script this process runs (``sys.argv``) differs from the recording's copy in
    ``run_dir/source``: whether it changed by more than logging (the likely cause of a divergence),
    and the ``flor.log`` calls it adds (``flor.source.hindsight.new_logs``)."""
    changed, logs = False, []
    current = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    copy = run_dir / "source" / Path(meta.script).name if meta.script else None
    if copy is not None and current is not None and current.is_file() and copy.is_file():
        data: bytes | None
        try:
            data = read_bytes(copy)  # a regular file, capped, no link followed
        except OSError as exc:
            note("FL307", f"the recording's copy of the script cannot be read ({exc.strerror or exc}); the script's "
                 "changes since the recording are not checked")
            data = None
        if data is not None and meta.script_sha256 and hashlib.sha256(data).hexdigest() != meta.script_sha256:
            note("FL307", f"the recording's copy of the script ({copy}) is not the script run.json names (its sha256 "
                 "differs: damaged, or cut short by a full disk); the script's changes since the recording are not "
                 "checked")
            data = None
        text = current.read_text(errors="replace") if data is not None else ""
        if data is not None:
            logs = new_logs(data.decode("utf-8", "replace"), text)
        if data is not None and non_logging_changes(data.decode("utf-8", "replace"), text):
            changed = True
            note("FL309", "the script changed by more than logging since the recording "
                 f"(compare with {copy}); replayed values may differ from the recording")
    rec_args = list(meta.argv)[1:]
    now_args = redact_argv(list(sys.argv))[1:]
    if rec_args != now_args:
        note("FL310", f"the script's arguments differ from the recording: recorded {rec_args}, now {now_args}")
    return changed, logs


def script_sha256() -> str | None:
    """sha256 of the script this process runs (``sys.argv[0]``): the version its logged values came from."""
    try:
        return hashlib.sha256(Path(sys.argv[0]).read_bytes()).hexdigest() if sys.argv and sys.argv[0] else None
    except OSError:
        return None
