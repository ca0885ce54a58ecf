"""Draws from the global random generators by code between one block's ``end()`` and the next
``step_into``: noted by the recording per block, compared by a replay.

Hindsight code after ``end()`` that samples from torch's global generator (nanoGPT's
``estimate_loss()`` draws its batches) changes what a full run of the edited script trains on
from there, while a replay restores or re-executes the next blocks from the recording's random
state. ``flor.engine.restorer`` sees it where the next block is restored right after an exact
one; a sparse recording re-executes the blocks in between, so the replay would say nothing. The
recording therefore notes, per block, which global generators the code before it ever drew from
(run.json ``drew_between``); a replay that finds another one drawn before a block says so (FL325,
a condition of the verdict) once a later block's recorded random state is set (a restore, or a
re-execution from its checkpoint): until then its re-executed blocks draw on as a full run does.
A recording without that note (older flor) is not compared.
"""

from __future__ import annotations

from typing import Any, Callable

from .probe import Probe, Say, View

__all__ = ["DrawsProbe", "recorded_draws"]


def _reader(skip: frozenset[str]) -> tuple[tuple[str, ...], Callable[[], Any], Callable[[Any, Any], Any]]:
    """``flor.state.draw_marks.draw_reader``, imported when first used (it imports torch: not at flor's
    import)."""
    from ..state.draw_marks import draw_reader

    return draw_reader(skip)


class DrawsProbe(Probe):
    """The global generators drawn from between a block's ``end()`` and the next ``step_into``:
    while recording, kept per block in ``drew`` (run.json ``drew_between``); while replaying,
    those the recording never drew before that block are said (FL325) once."""

    def __init__(self, recorded: dict[str, list[str]] | None = None) -> None:
        self.recorded = recorded  # replaying: the recording's drew_between (None: not compared)
        self.drew: dict[str, set[str]] = {}
        self.last: Any = None
        self.pending: tuple[str, int | None, list[str]] | None = None  # replaying: draws not said yet
        self.late = False  # replaying: a block's recorded state after epoch 0 was set
        self.said = False
        #: recording: the generators every block so far is known to have drawn before (not looked at again)
        self._known: frozenset[str] = frozenset()
        #: draw_reader(self._known): the generators read, read(), drawn(before, now)
        self._read: tuple[tuple[str, ...], Callable[[], Any], Callable[[Any, Any], Any]] | None = None

    def leave(self, view: View, say: Say) -> None:
        if view.replay and (self.recorded is None or self.said):
            return
        # at every block run (a sampling evaluation may run every N of them), so only what tells a draw
        # (``draw_reader``), and not the generators every block seen so far is known to have drawn from
        if self._read is None:
            self._read = _reader(self._known)
        keys, read, drawn = self._read
        self.last = (keys, read, drawn, read())

    def enter(self, view: View, say: Say) -> None:
        last, self.last = self.last, None
        if last is None or (view.replay and (self.recorded is None or self.said)):
            return
        _, read, drawn, before = last
        found = drawn(before, read())  # nothing drawn (most runs): an empty frozenset, no set made
        if not view.replay:
            if found:
                drew = self.drew.setdefault(view.block, set())
                drew.update(found)
                known = frozenset.intersection(*(frozenset(d) for d in self.drew.values()))
                if known != self._known:
                    self._known, self._read = known, None
            elif view.block not in self.drew:
                self.drew[view.block] = set()
                if self._known:
                    self._known, self._read = frozenset(), None
            return
        new = sorted(found.difference((self.recorded or {}).get(view.block, ())))
        if new and self.pending is None:  # said where a block's recorded random state is then set
            self.pending = (view.block, view.epoch, new)
            if self.late:  # ... or was: a worker's state restored after epoch 0 is the recording's training
                self._said(say)

    def restore(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        self._set(view, say)
        return []

    def compare(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        self._set(view, say)  # re-executed from its checkpoint: it started from the recorded random state
        return []

    def _set(self, view: View, say: Say) -> None:
        """A block's recorded random state was set (restored, or re-executed from its checkpoint)."""
        self.late = self.late or (view.epoch or 0) > 0  # a full run would have drawn in the epochs before
        self._said(say)

    def _said(self, say: Say) -> None:
        """A block restored, or re-executed from its recorded random state, after the draws: from
        here the replay's training is the recording's, not a full run's (re-executed blocks without
        a checkpoint draw on from where the hindsight code left the generators, as a full run does)."""
        if self.pending is None or self.said:
            return
        self.said = True
        block, epoch, new = self.pending
        say("FL325", block,
            f"code outside the blocks drew from the {', '.join(new)} random generator before {block!r} at epoch "
            f"{epoch}, which the recording's code never did there (a hindsight line that samples?): a full run of "
            "this script trains on other numbers from there, while this replay then set a block's recorded random "
            "state (a restore or a re-execution from its checkpoint); draw from a torch.Generator of your own in "
            "hindsight code")

    def noted(self) -> dict[str, list[str]]:
        """``drew_between`` for run.json."""
        return {block: sorted(found) for block, found in sorted(self.drew.items()) if found}


def recorded_draws(extra: dict[str, Any]) -> dict[str, list[str]] | None:
    """run.json's ``drew_between`` (read from a store: strings only), or None where absent."""
    found = extra.get("drew_between")
    if not isinstance(found, dict):
        return None
    return {str(k): [g for g in v if isinstance(g, str)] for k, v in found.items() if isinstance(v, list)}
