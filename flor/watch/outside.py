"""In-place changes to the modules given to ``end()`` made by code outside the blocks."""

from __future__ import annotations

import sys
from types import MappingProxyType
from typing import Any, Mapping

from .._fmt import listed
from .limits import LIMITS
from .probe import Probe, Say, View

__all__ = ["OutsideChanges", "OutsideProbe"]

#: no change found (one empty mapping, not a dict a run)
NOTHING: Mapping[str, int] = MappingProxyType({})

#: registrations of a parameter, buffer or submodule in this process, by any module (torch's global
#: registration hooks, installed by the first walk): a count that moved since the last walk means a
#: tensor of the modules walked may have been replaced (``net.weight = nn.Parameter(...)``)
_REGISTERED = [0]
_HOOKED: list[bool] = []

#: the count noted for a tensor the code outside the blocks replaced (rather than changed in place)
REPLACED = -1


def _registered(*_: Any) -> None:
    _REGISTERED[0] += 1


def _hook(torch: Any) -> None:
    """torch's three global registration hooks count registrations (once a process; an assignment
    of a parameter, a buffer or a submodule goes through them, ``Module.__setattr__``)."""
    if _HOOKED:
        return
    _HOOKED.append(True)
    module = torch.nn.modules.module
    for register in ("register_module_parameter_registration_hook", "register_module_buffer_registration_hook",
                     "register_module_module_registration_hook"):
        hook = getattr(module, register, None)
        if hook is not None:
            hook(_registered)


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
    about 0.05 µs a tensor at ``end()`` and again at ``step_into``, at every block run (a change
    between two runs without a checkpoint counts as much as one before a checkpointed run: a
    replay re-executes or restores after both); the modules' tensors are found by walking them
    at checkpointed runs, every ``WALK_EVERY`` runs and after a parameter, buffer or submodule
    was registered anywhere (a few µs for a small model). A tensor replaced between two runs
    (``net.weight = nn.Parameter(...)``, a new submodule) is noted as ``REPLACED``.
    """

    #: block runs between two walks of the modules' tensors when nothing was registered meanwhile: a run
    #: in between reads the counters of the tensors found then (a tensor swapped into a module's
    #: ``_parameters`` by hand, not through ``setattr``, is read at the next walk)
    WALK_EVERY = 64

    def __init__(self) -> None:
        self.objs: tuple = ()  # (index, module) of what the last walk was given
        self.types: tuple = ()  # the types of what the last end() was given (its modules: ``objs``)
        self.paths: list[str] = []
        self.tensors: list[Any] = []
        self.versions: list[int] | None = None  # at the last end(); None: read at step_into already
        self.runs = 0  # since the last walk
        self.registered = -1  # ``_REGISTERED`` at the last walk

    def ended(self, objs: tuple, *, walk: bool = False) -> None:
        """At ``end()``: the version of every parameter and buffer of the modules it is given.
        The modules are walked when they are other objects than last time, when ``walk`` (a
        checkpointed run) and every ``WALK_EVERY`` runs; the counters are read at every run
        (~0.05 us a tensor)."""
        try:
            types = tuple(map(type, objs))
            same = (types == self.types and not walk and self.runs < self.WALK_EVERY
                    and self.registered == _REGISTERED[0])
            if same:  # the same kinds of objects as last time: the same modules? (no generator: every run)
                for i, mod in self.objs:
                    if objs[i] is not mod:
                        same = False
                        break
            if not same:
                torch = sys.modules.get("torch")
                if torch is None:
                    return
                module = torch.nn.Module
                _hook(torch)
                self._walk(tuple((i, obj) for i, obj in enumerate(objs) if isinstance(obj, module)))
                self.types = types
            self.runs += 1
            self.versions = [t._version for t in self.tensors]
        except Exception:  # noqa: BLE001 - a check, never a reason for training to stop
            self.objs, self.types, self.paths, self.tensors, self.versions = (), (), [], [], None

    def _walk(self, mods: tuple) -> None:
        self.registered = _REGISTERED[0]
        paths: list[str] = []
        tensors: list[Any] = []
        for i, obj in mods:
            for part in (obj.named_parameters(), obj.named_buffers()):
                for path, t in part:
                    paths.append(f"end() object {i}: {path}")
                    tensors.append(t)
        self.objs, self.paths, self.tensors, self.runs = mods, paths, tensors, 0

    def started(self) -> Mapping[str, int]:
        """At ``step_into``: ``{tensor: in-place operations}`` since the last ``end()``."""
        before, self.versions = self.versions, None
        if not before:
            return NOTHING
        try:
            if self.registered != _REGISTERED[0]:  # something was registered since: a tensor replaced?
                return self._walked_again(before)
            now = [t._version for t in self.tensors]
            if now == before:
                return NOTHING
            return dict(list({path: n - b for path, n, b in zip(self.paths, now, before)
                              if n != b}.items())[:LIMITS.outside])
        except Exception:  # noqa: BLE001 - as above
            return NOTHING

    def _walked_again(self, before: list[int]) -> Mapping[str, int]:
        """``started`` after a registration: the same modules walked again; a tensor at another path
        or gone is ``REPLACED``, one still there changed as many times as its counter moved."""
        was = dict(zip(self.paths, zip(self.tensors, before)))
        self._walk(self.objs)
        found: dict[str, int] = {}
        for path, t in zip(self.paths, self.tensors):
            old = was.pop(path, None)
            if old is None or old[0] is not t:
                found[path] = REPLACED
            elif t._version != old[1]:
                found[path] = t._version - old[1]
        found.update(dict.fromkeys(was, REPLACED))  # removed (a submodule set to None)
        return dict(list(found.items())[:LIMITS.outside]) if found else NOTHING


class OutsideProbe(Probe):
    """``OutsideChanges`` as a probe: the in-place changes since the last ``end()`` are read at
    each ``step_into``; recording, they are noted with the block run (``"outside"``); replaying,
    others than the recording's are named once (``check``) and returned for the verdict."""

    def __init__(self) -> None:
        self.changes = OutsideChanges()
        self.found: Mapping[str, int] = NOTHING
        self.said = False

    def enter(self, view: View, say: Say) -> None:
        self.found = self.changes.started()

    def leave(self, view: View, say: Say) -> None:
        if self.found and not view.replay:
            view.noted["outside"] = self.found
        self.found = NOTHING
        self.changes.ended(view.objs, walk=view.note and not view.replay)

    def check(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        if not self.found or self.said:
            return []
        recorded = noted.get("outside", {})
        new = [path for path, ops in self.found.items() if recorded.get(path) != ops]
        if new:
            self.said = True
            say("FL328", None, f"code outside the blocks changed {listed(new, 4)} in place (or replaced it) "
                f"before {view.block!r} at epoch {view.epoch}, where the recorded script did not (a hindsight "
                "line that runs the model in training mode updates BatchNorm statistics; one that steps an "
                "optimizer changes the weights; one that assigns a new parameter replaces it): a "
                "full run of this script trains on from there, while this replay restores or re-executes the "
                "recorded training, so its later values are not a full run's; evaluate on a copy "
                "(copy.deepcopy(model).eval()) or under model.eval()")
        return new
