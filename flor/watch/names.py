"""Names a block binds: those the code after ``end()`` reads that ``end()`` is not given, and
those ``end()`` is given that were unbound when the block was first entered
(``flor.source.blocks`` reads the script's syntax tree)."""

from __future__ import annotations

from types import FrameType
from typing import Any

from ..source.blocks import script_tree, stale_names
from .frames import frame_variables
from .probe import Probe, Say, View

__all__ = ["NamesProbe", "block_site", "stale_at_end", "unbound_given"]

def block_site(frame: FrameType | None) -> tuple[str, int, set[str]] | None:
    """Where a block is entered (file, line) and the names bound there, for ``stale_names`` and
    ``unbound_given`` at its ``end()``. The Watch runner catches what it raises."""
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno, set(frame_variables(frame))


def stale_at_end(site: tuple[str, int, set[str]] | None, frame: FrameType | None) -> list[str]:
    """``stale_names`` of the block entered at ``site`` and ended in ``frame``, sorted. The Watch
    runner catches what it raises."""
    if site is None or frame is None or frame.f_code.co_filename != site[0]:
        return []
    tree = script_tree(frame)
    return sorted(stale_names(tree, site[1], frame.f_lineno)) if tree is not None else []


def unbound_given(site: tuple[str, int, set[str]] | None, frame: FrameType | None, objs: tuple) -> list[str]:
    """Names of ``frame`` bound to an object given to ``end(*objs)`` that were not bound when the
    block was entered at ``site``, sorted. The Watch runner catches what it raises."""
    if site is None or frame is None:
        return []
    ids = {id(o) for o in objs}
    return sorted(var for var, value in frame_variables(frame).items() if var not in site[2] and id(value) in ids)


class NamesProbe(Probe):
    """Names a block binds that a restore does not (``stale_at_end``, ``unbound_given``), named
    once a block: at its first ``end()`` while recording, at its first restore while replaying
    (the script as it is now). The probes before it put what they note or name in
    ``view.named``: a name set as recorded is not stale."""

    quiet = frozenset({"leave"})  # the first end() that comes (a first run may be left open) (Probe.quiet)
    steady = frozenset()  # ... has come once the block ended twice (Probe.steady)

    def __init__(self) -> None:
        self.sites: dict[str, tuple[str, int, set[str]] | None] = {}
        self.done: set[str] = set()

    def enter(self, view: View, say: Say) -> None:
        if view.block not in self.done and view.block not in self.sites:
            self.sites[view.block] = block_site(view.frame)

    def leave(self, view: View, say: Say) -> None:
        if view.block in self.done or view.replay:
            return
        self.done.add(view.block)
        site = self.sites.pop(view.block, None)
        name = view.block
        for var in stale_at_end(site, view.frame):
            if var not in view.named:
                say("FL204", (name, var),
                    f"SkipBlock.end({name!r}) is not given `{var}`, which the block assigns and the code after "
                    f"end() reads: a replay that restores {name!r} skips the block, so `{var}` keeps the value it had "
                    f"before it (or is not defined); bind it before the loop (`{var} = None`) and pass it: "
                    f"`..., {var} = flor.SkipBlock.end(..., {var})`")
        for var in unbound_given(site, view.frame, view.objs):
            say("FL205", (name, var),
                f"SkipBlock.end({name!r}) is given `{var}`, which was not bound when the block was first entered: a "
                f"replay that restores that run skips the block, and `{var}` is not defined when end() is called "
                f"(NameError); bind it before the loop ({var} = None)")

    def restore(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        if view.block in self.done:
            return []
        self.done.add(view.block)
        name = view.block
        stale = [var for var in stale_at_end(self.sites.pop(name, None), view.frame) if var not in view.named]
        for var in stale:
            say("FL204", (name, var),
                f"SkipBlock.end({name!r}) is not given `{var}`, which the block assigns and the code after end() "
                f"reads: where {name!r} is restored, `{var}` keeps the value it had before the block (or is not "
                "defined), unlike a full re-execution; pass it to end() (and bind it before the loop) and record "
                "again")
        return stale
