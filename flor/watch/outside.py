"""In-place changes to the modules given to ``end()`` made by code outside the blocks."""

from __future__ import annotations

import sys
from typing import Any

from .._fmt import listed
from .limits import LIMITS
from .probe import Probe, Say, View

__all__ = ["OutsideChanges", "OutsideProbe"]

#: the most tensor names one block's ``OutsideChanges`` notes or reads back



class OutsideChanges:
    """In-place changes to the tensors of the modules given to the last ``end()`` that code
    outside the blocks makes before the next ``step_into`` (of any block: another block's
    training or restore is never counted), from their version counters.

    A forward pass in training mode updates BatchNorm's running statistics, a parametrized
    ``spectral_norm`` its power-iteration vectors, and an optimizer step the weights. Done by
    the recorded script between blocks, a replay does it too. Done by a hindsight line only (a
    loss computed on the model left in training mode), a full run of the edited script trains
    on from the changed model, while a replay that restores the next block puts the recording's
    back: its values are the recording's training, not a full run's. The recording notes the
    names each block run found changed, with how many in-place operations changed each
    (``"outside"`` in ``logs/state.jsonl``); a replay that finds others, or other counts
    (a hindsight forward besides the script's own), says so. Reading a counter costs no copy:
    about 1 µs a tensor at ``end()``.
    """

    def __init__(self) -> None:
        self.after: list[tuple[str, Any, int]] = []  # (name, tensor, version) at the last end()

    def ended(self, objs: tuple) -> None:
        """At ``end()``: the version of every parameter and buffer of the modules it is given."""
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            watched: list[tuple[str, Any, int]] = []
            for i, obj in enumerate(objs):
                if isinstance(obj, torch.nn.Module):
                    for part in (obj.named_parameters(), obj.named_buffers()):
                        watched.extend((f"end() object {i}: {path}", t, t._version) for path, t in part)
            self.after = watched
        except Exception:  # noqa: BLE001 - a check, never a reason for training to stop
            self.after = []

    def started(self) -> dict[str, int]:
        """At ``step_into``: ``{tensor: in-place operations}`` since the last ``end()``."""
        watched, self.after = self.after, []
        if not watched:
            return {}
        try:
            return dict(list({path: t._version - version for path, t, version in watched
                              if t._version != version}.items())[:LIMITS.outside])
        except Exception:  # noqa: BLE001 - as above
            return {}


class OutsideProbe(Probe):
    """``OutsideChanges`` as a probe: the in-place changes since the last ``end()`` are read at
    each ``step_into``; recording, they are noted with the block run (``"outside"``); replaying,
    others than the recording's are named once (``check``) and returned for the verdict."""

    def __init__(self) -> None:
        self.changes = OutsideChanges()
        self.found: dict[str, int] = {}
        self.said = False

    def enter(self, view: View, say: Say) -> None:
        self.found = self.changes.started()

    def leave(self, view: View, say: Say) -> None:
        if self.found and not view.replay:
            view.noted["outside"] = self.found
        self.found = {}
        self.changes.ended(view.objs)

    def check(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        if not self.found or self.said:
            return []
        recorded = noted.get("outside", {})
        new = [path for path, ops in self.found.items() if recorded.get(path) != ops]
        if new:
            self.said = True
            say("FL328", None, f"code outside the blocks changed {listed(new, 4)} in place before {view.block!r} at "
                f"epoch {view.epoch}, where the recorded script did not (a hindsight line that runs the model in "
                "training mode updates BatchNorm statistics; one that steps an optimizer changes the weights): a "
                "full run of this script trains on from there, while this replay restores or re-executes the "
                "recorded training, so its later values are not a full run's; evaluate on a copy "
                "(copy.deepcopy(model).eval()) or under model.eval()")
        return new
