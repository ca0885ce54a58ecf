"""A block's own variables: the plain data a block run changes outside ``end()`` (its frame's
variables, the globals it declares, the attributes of the script's own objects), noted at
``end()`` and set by a replay that restores the block."""

from __future__ import annotations

import json
from types import FrameType
from typing import Any, Collection

from .._fmt import listed
from .attributes import object_attrs, restore_attrs
from .carried import not_state
from .frames import (CO_OPTIMIZED, changed_entries, compare_keys, given_ids, global_names, holds_state, own_object,
                     plain_now, skipped_name)
from .loop import LoopFrame
from .limits import LIMITS
from .plain import CONTAINERS, decode, encode
from .probe import Probe, Say, View

__all__ = ["BlockVars", "VariablesProbe", "restore_globals", "stored_globals"]

class BlockVars:
    """The plain-data variables a SkipBlock changes outside the objects given to ``end()``.

    A batch loop counts steps (``step += 1``), sums a loss (``total += loss.item()``), appends
    to a history or updates a dict of running metrics, and the code after the block reads them.
    A replay that restores the block does not run its body, so without help those variables
    keep the values they had before it. The recording therefore notes, at each ``end()``, the
    plain-data variables of the block's frame whose value the block changed (or bound anew),
    kept in the block run's checkpoint manifest (``"watch"``, covered by its checksum); a replay
    that restores the block sets them as noted, so the code after it sees what a full run sees.
    The same for the module globals a block in a function declares ``global``
    (``stored_globals``) and the plain attributes of the script's own objects in the frame that
    ``end()`` is not given (``object_attrs``: ``self.step`` in a Trainer's method).

    Only what the block changed is noted: a variable the edited script sets before the block
    (a setting changed for the hindsight run) is left as the replay's code sets it. Values are
    encoded as for the outer-loop state, at most ``LIMITS.block_items`` scalars a variable; a
    container the block grows past that, or that holds tensors, is still named by the
    recording's warning (``grown_containers``). Never raises into training.
    """

    def __init__(self) -> None:
        self.frames: dict[str, LoopFrame] = {}
        self.noted: dict[str, set[str]] = {}  # block -> the variables noted at one of its ends so far
        self.given: dict[str, set[int]] = {}  # block -> ids of the containers its last end() was given
        self.warned: set[tuple[str, str]] = set()
        self.globals_initial: dict[str, dict[str, Any]] = {}  # block -> its function's globals at entry
        self.attrs_initial: dict[str, dict[str, dict[str, Any]]] = {}  # block -> its objects' attributes at entry
        self.passed: dict[str, set[int]] = {}  # block -> ids of what its last end() was given (``given_ids``)
        self.attr_ids: dict[str, dict[tuple[str, str], int]] = {}  # block -> its objects' attributes at first entry

    def enter(self, name: str, frame: FrameType | None) -> None:
        """At the block's entry: its frame's plain-data variables, to compare at ``leave``."""
        if frame is None:
            return
        try:
            lf = self.frames.get(name)
            if lf is None:  # its imports, functions and classes are found once and skipped after
                lf = self.frames[name] = LoopFrame(frame, limit=LIMITS.block_items)
                lf.track = False
                lf.start(loop=False)
            else:
                lf.frame = frame  # a block in a function: a new frame each call
                lf.initial = compare_keys(lf.plain(skip=self.given.get(name, ())))
            variables = lf.variables()
            self.globals_initial[name] = compare_keys(stored_globals(frame))
            self.attrs_initial[name] = {var: compare_keys(attrs)
                                        for var, attrs in object_attrs(variables, self.passed.get(name, ())).items()}
            if name not in self.noted:  # its first run: what its objects' attributes are, to name state it rebinds
                self.attr_ids[name] = {(var, attr): id(v) for var, value in variables.items()
                                       if not skipped_name(var) and own_object(value)
                                       for attr, v in vars(value).items()}
        except Exception:  # noqa: BLE001 - nothing is noted for this run of the block
            self.frames.pop(name, None)

    def leave(self, name: str, objs: tuple = (), passed: set[int] | None = None,
              ) -> tuple[dict[str, Any], dict[str, Any], list[tuple[str, str]]]:
        """``{variable: encoded}`` of those the block changed since ``enter``, but for a container
        given to ``end()`` (its checkpoint holds it); ``{"globals": ..., "attrs": ...}``, where
        not empty, of the module globals a block in a function changed that the function
        declares ``global`` (``global_step += 1``, ``stored_globals``) and of the plain attributes
        it changed of the script's own objects not given to ``end()`` (``self.step += 1``,
        ``object_attrs``: ``{variable: {attribute: encoded}}``); and, once each, ``(variable, what)`` of
        those it changed that cannot be noted, for a warning: one noted before that no longer
        is (``"too big"``: a history grown past ``LIMITS.block_items``), or one it bound to state
        that is not plain data (``"state"``: a copy of the best weights, in place of a None or
        of an earlier copy). Lets go of the frame."""
        lf = self.frames.get(name)
        if lf is None or lf.frame is None:
            return {}, {}, []
        try:
            initial, now = lf.initial, lf.variables()
            given = self.given[name] = {id(o) for o in objs if type(o) in CONTAINERS}
            plain = lf.plain(given, skip=given)
            changed = {var: value for var, value in changed_entries(plain, initial).items()
                       if id(now.get(var)) not in given}
            passed = self.passed[name] = given_ids(objs) if passed is None else passed
            was = self.attrs_initial.pop(name, {})
            plain_attrs = object_attrs(now, passed)
            attrs = {var: diff for var, found in plain_attrs.items()
                     if (diff := changed_entries(found, was.get(var, {})))}
            globals_ = changed_entries(stored_globals(lf.frame, given), self.globals_initial.pop(name, {}))
            more = {part: found for part, found in (("globals", globals_), ("attrs", attrs)) if found}
            first = name not in self.noted
            noted = self.noted.setdefault(name, set())
            lost = [(var, "too big" if var in noted else "state")
                    for var in sorted((noted | initial.keys()) - plain.keys())
                    if var in now and (var in noted or holds_state(now[var]))]
            if first:  # state bound before the block, rebound by its first run: a copy of the best weights
                lost += [(var, "state") for var, (ident, _) in sorted(lf.before.items())
                         if var in now and id(now[var]) != ident and var not in plain and holds_state(now[var])]
                ids = self.attr_ids.pop(name, {})  # ... or kept on self: self.best_state
                lost += [(f"{var}.{attr}", "state") for var, value in sorted(now.items())
                         if id(value) not in passed and not skipped_name(var) and own_object(value)
                         for attr, v in sorted(vars(value).items())
                         if ids.get((var, attr)) != id(v) and attr not in plain_attrs.get(var, {})
                         and id(v) not in passed and holds_state(v)]
            lost = [(var, what) for var, what in lost
                    if (name, var) not in self.warned
                    and ("." in var or (id(now[var]) not in passed and not skipped_name(var)))]
            self.warned.update((name, var) for var, _ in lost)
            noted.update(changed)
            return changed, more, lost
        except Exception:  # noqa: BLE001 - nothing is noted for this run of the block
            return {}, {}, []
        finally:
            lf.frame = None



def stored_globals(frame: FrameType, skip: Collection[int] = ()) -> dict[str, Any]:
    """``{name: encoded}`` of the plain-data module globals a function's frame assigns
    (``global_names``), but for the containers whose ids are in ``skip``; empty for a module's
    frame, whose globals are its variables."""
    if not frame.f_code.co_flags & CO_OPTIMIZED:
        return {}
    module, out = frame.f_globals, {}
    for var in global_names(frame.f_code):
        if var in module and id(module[var]) not in skip:
            try:
                out[var] = encode(module[var], LIMITS.block_items)
            except Exception:  # noqa: BLE001 - NotPlain, or an odd value: not noted
                continue
    return out



def restore_globals(frame: FrameType, values: dict[str, Any]) -> list[str]:
    """Set the module globals in ``values`` that the function of ``frame`` assigns itself
    (``global_names``; values from a store never bind another name) and that hold plain data or
    nothing now; return the names left as they are."""
    allowed = global_names(frame.f_code) if frame.f_code.co_flags & CO_OPTIMIZED else frozenset()
    module, left = frame.f_globals, []
    for var, value in values.items():
        if var in allowed and (var not in module or plain_now(module[var])):
            module[var] = value
        else:
            left.append(var)
    return sorted(left)



def _attr_path(key: Any) -> bool:
    """``key`` is an attribute, or a dotted path of at most ``LIMITS.attr_depth`` attributes, each an
    identifier that is not a dunder."""
    parts = key.split(".") if isinstance(key, str) else []
    return 0 < len(parts) <= LIMITS.attr_depth and all(p.isidentifier() and not skipped_name(p) for p in parts)



def _canonical(node: Any) -> str:
    """A node as a manifest keeps it (keys sorted): what a re-executed run's value compares by."""
    return json.dumps(node, sort_keys=True, allow_nan=True, separators=(",", ":"))


def _named(names: Any) -> dict[str, Any]:
    """The entries of ``names`` under identifiers that are not dunders."""
    if not isinstance(names, dict):
        return {}
    return {k: v for k, v in names.items() if isinstance(k, str) and k.isidentifier() and not skipped_name(k)}


class VariablesProbe(Probe):
    """A block run's plain variables, the globals it declares and the attributes of the script's
    own objects: noted at ``end()`` where they changed (``BlockVars``), set by a replay that
    restores the run. What changed but cannot be noted (not plain data, too big) is named once."""

    quiet = frozenset()  # notes at checkpointed runs and a block's first only (Probe.quiet)

    def __init__(self) -> None:
        self.vars = BlockVars()
        self.restored: set[str] = set()  # blocks whose restore a note named
        self.ever: dict[str, set[str]] = {}  # block -> the variables and globals noted at any of its runs
        self.sites: dict[str, tuple[str, int] | None] = {}  # block -> where it is entered (``not_state``)

    def enter(self, view: View, say: Say) -> None:
        if view.block not in self.sites:
            frame = view.frame
            self.sites[view.block] = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)
        if not view.replay and view.note:
            self.vars.enter(view.block, view.frame)

    def leave(self, view: View, say: Say) -> None:
        if view.replay or not view.note:
            return
        changed, more, lost = self.vars.leave(view.block, view.objs, view.given)
        if lost:  # bound in the block before it reads it, and read nowhere else: not state (a dict for torch.save);
            # a name only: an attribute (self.best_state) may be read by code this script's tree does not show
            dead = not_state(self.sites.get(view.block), view.frame, [var for var, _ in lost if "." not in var])
            lost = [(var, what) for var, what in lost if var not in dead]
        if changed:
            view.noted["vars"] = changed
        view.noted.update(more)
        ever = self.ever.setdefault(view.block, set())
        ever.update(changed, more.get("globals", ()))
        if ever:  # a replay names none of them stale (NamesProbe): they are set where the block is restored
            view.noted["named"] = sorted(ever)
        view.named.update(changed, more.get("globals", ()), (var for var, _ in lost))
        where = "" if view.epoch is None else f" at epoch {view.epoch}"
        for var, what in lost:
            if what == "too big":
                first = (f"`{var}`, which SkipBlock {view.block!r} changes outside end(), is no longer plain data "
                         f"of at most {LIMITS.block_items} items{where}")
            else:
                first = f"SkipBlock {view.block!r} bound `{var}` outside end(){where} to state that is not plain data"
            say("FL207", (view.block, var),
                f"{first}: a replay that restores {view.block!r} leaves `{var}` as it was, so values read from it "
                f"after the block differ from the recording's; pass it to SkipBlock.end(..., {var}) and use what "
                "end() returns")

    def compare(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        """The variables and globals the recording's run noted (``noted["vars"]``, ``["globals"]``)
        whose values the re-executed run left otherwise (or not as plain data): ``variable x``."""
        frame = view.frame
        if frame is None:
            return []
        differs = []
        for part, where in (("vars", {**frame.f_globals, **frame.f_locals}), ("globals", frame.f_globals)):
            for var, node in _named(noted.get(part, {})).items():
                try:
                    same = var in where and _canonical(encode(where[var], LIMITS.block_items)) == _canonical(node)
                except Exception:  # noqa: BLE001 - NotPlain now, or an odd value: not what was recorded
                    same = False
                if not same:
                    differs.append(f"variable {var}")
        return differs

    def restore(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        """Set the variables, globals and attributes noted for this run as they were at its end
        (read from a store: only identifiers that are not dunders, attribute paths of them)."""
        view.named.update(n for n in noted.get("named", ()) if isinstance(n, str))  # not stale (NamesProbe)
        noted = {"vars": _named(noted.get("vars", {})), "globals": _named(noted.get("globals", {})),
                 "attrs": {var: {k: v for k, v in attrs.items() if _attr_path(k)}
                           for var, attrs in _named(noted.get("attrs", {})).items() if isinstance(attrs, dict)}}
        if not any(noted.values()):
            return []
        missing: list[str] = []

        def decoded(found: dict[str, Any], prefix: str = "") -> dict[str, Any]:
            out = {}
            for var, node in found.items():
                try:
                    out[var] = decode(node)
                except (ValueError, TypeError, AttributeError):
                    missing.append(prefix + var)
            return out

        values, module = decoded(noted.get("vars", {})), decoded(noted.get("globals", {}))
        attrs = {var: decoded(found, f"{var}.") for var, found in noted.get("attrs", {}).items()}
        named = set(values) | set(module) | {f"{var}.{attr}" for var, found in attrs.items() for attr in found}
        frame = view.frame
        if frame is None:
            missing += sorted(named)
        else:
            lf = LoopFrame(frame)
            missing += lf.restore(values) + restore_globals(frame, module) + restore_attrs(lf.variables(), attrs)
        if view.block not in self.restored:
            self.restored.add(view.block)
            done = sorted(named - set(missing))
            if done:
                say("FL326", (view.block, "set"), f"variables block {view.block!r} changes outside end() are set as "
                    f"recorded where it is restored: {listed(done, 12)}")
            if missing:
                say("FL337", (view.block, "left"), f"variables block {view.block!r} changes outside end() that could "
                    f"not be set where it is restored: {listed(sorted(missing), 12)}; pass them to SkipBlock.end")
        return missing
