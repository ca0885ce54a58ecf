"""Names a block binds: those the code after ``end()`` reads that ``end()`` is not given, and
those ``end()`` is given that were unbound when the block was first entered
(``flor.source.blocks`` reads the script's syntax tree)."""

from __future__ import annotations

from types import FrameType

from ..source.blocks import _tree, stale_names
from .frames import frame_variables

__all__ = ["block_site", "stale_at_end", "stale_note", "unbound_given", "warn_bindings"]

def block_site(frame: FrameType | None) -> tuple[str, int, set[str]] | None:
    """Where a block is entered (file, line) and the names bound there, for ``stale_names`` and
    ``unbound_given`` at its ``end()``. Never raises."""
    try:
        if frame is None:
            return None
        return frame.f_code.co_filename, frame.f_lineno, set(frame_variables(frame))
    except Exception:  # noqa: BLE001 - advice only
        return None



def stale_at_end(site: tuple[str, int, set[str]] | None, frame: FrameType | None) -> list[str]:
    """``stale_names`` of the block entered at ``site`` and ended in ``frame``, sorted. Never raises."""
    try:
        if site is None or frame is None or frame.f_code.co_filename != site[0]:
            return []
        tree = _tree(frame)
        return sorted(stale_names(tree, site[1], frame.f_lineno)) if tree is not None else []
    except Exception:  # noqa: BLE001 - advice only
        return []



def unbound_given(site: tuple[str, int, set[str]] | None, frame: FrameType | None, objs: tuple) -> list[str]:
    """Names of ``frame`` bound to an object given to ``end(*objs)`` that were not bound when the
    block was entered at ``site``, sorted. Never raises."""
    try:
        if site is None or frame is None:
            return []
        ids = {id(o) for o in objs}
        return sorted(var for var, value in frame_variables(frame).items() if var not in site[2] and id(value) in ids)
    except Exception:  # noqa: BLE001 - advice only
        return []



def warn_bindings(name: str, stale: list[str], unbound: list[str]) -> None:
    """Warn, while recording, about the names ``stale_at_end`` and ``unbound_given`` found. Never
    raises, even under ``-W error``: it only advises."""
    from ..errors import warn

    try:
        for var in stale:
            warn("FL204", f"SkipBlock.end({name!r}) is not given `{var}`, which the block assigns and the code after end() "
                 f"reads: a replay that restores {name!r} skips the block, so `{var}` keeps the value it had before "
                 f"it (or is not defined); bind it before the loop (`{var} = None`) and pass it: "
                 f"`..., {var} = flor.SkipBlock.end(..., {var})`")
        for var in unbound:
            warn("FL205", f"SkipBlock.end({name!r}) is given `{var}`, which was not bound when the block was first entered: a "
                 f"replay that restores that run skips the block, and `{var}` is not defined when end() is called "
                 f"(NameError); bind it before the loop ({var} = None)")
    except Exception:  # noqa: BLE001 - advice that cannot be given must not stop training
        return



def stale_note(name: str, stale: list[str]) -> list[str]:
    """The replay's notes about the names ``stale_at_end`` found in the script as it is now."""
    return [f"SkipBlock.end({name!r}) is not given `{var}`, which the block assigns and the code after end() reads: "
            f"where {name!r} is restored, `{var}` keeps the value it had before the block (or is not defined), "
            f"unlike a full re-execution; pass it to end() (and bind it before the loop) and record again"
            for var in stale]
