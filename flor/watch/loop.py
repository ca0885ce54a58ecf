"""Outer-loop state: the plain-data variables of the frame that iterates ``flor.it``.

Scripts keep state in the epoch loop itself, outside the objects given to ``SkipBlock.end``:
a best validation loss, a patience counter, an EMA of the loss, a sample counter, a learning
rate set by hand. A replay worker that starts mid-run skips the epochs before its segment,
so without help it would start that state fresh. The recording therefore notes, at the end
of each epoch a worker may start after (before one that may be checkpointed:
``flor.engine.record``), the variables of the loop's frame (module globals for a top-level loop, the
function's locals for a loop inside a function) that are plain data: numbers, strings,
bools, None, NumPy and 0-d tensor scalars, numeric NumPy arrays of up to 256 values, and small tuples,
lists, dicts, deques, Counters, OrderedDicts and defaultdicts (of list, int, float, dict or
str) of them. A
worker that starts at epoch ``a > 0`` restores the values noted after epoch ``a - 1`` before
its first epoch runs.

What is not plain data (a list past ``LIMITS.items`` items, a dict of tensors, any object) and
was bound before the loop and changed in it is *named* instead: the worker says which
variables it could not restore and how to fix that (pass them to ``end()``, or replay with
``--flor_strong``). Locals of a function are written back with ``PyFrame_LocalsToFast`` up
to Python 3.12 and through the write-through ``frame.f_locals`` of PEP 667 from 3.13;
where neither exists, they are named too.

A variable the loop has not changed by the end of epoch ``a - 1`` (``"unchanged"``: its value
then, and at every epoch end noted before, is the one it had when the loop started: a timer, a
path, a setting read before the loop) is left as the worker's own code before the loop set
it, as a full re-execution would have it, rather than given the recording's value.

One JSON line per noted epoch goes to ``logs/state.jsonl`` (``StateFile``); values are tagged so that a
tuple comes back a tuple and a float32 scalar a float32 scalar. The file is untrusted input
when replayed: a line that does not decode is ignored, a value that does not decode is
named, and nothing in it can run code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any, Collection, Iterable, NamedTuple

from .._files import StoreFileError, open_append, read_text
from .._fmt import listed
from ..errors import ReplayError
from ..source.blocks import loop_names, script_tree
from .frames import (CO_OPTIMIZED, NUMBERS, identity_and_size, maybe_scalar, plain_now, same_key, scalar_like,
                     skipped_name, state_like, loop_targets)
from .limits import LIMITS
from .plain import CONTAINERS, SCALARS, LEAF_TYPES, NotPlain, decode, encode
from .probe import Say

__all__ = ["LoopFrame", "LoopState", "State", "StateFile", "read_state"]



class LoopFrame:
    """The frame that iterates ``flor.it``: read at epoch boundaries, written back in a replay."""

    def __init__(self, frame: FrameType, limit: int = LIMITS.items) -> None:
        self.frame: FrameType | None = frame
        self.limit = limit  # the most scalars one variable may hold
        self.track = True  # name what is not plain data (``_not_plain``); a block's frame does not
        self.function = bool(frame.f_code.co_flags & CO_OPTIMIZED)
        self.where = f"{frame.f_code.co_name}()" if self.function else "the module"
        self.targets: set[str] = set()
        self.before: dict[str, tuple[int, int | None]] = {}  # non-plain variables at the loop's start
        self.changed: set[str] = set()  # ... that the loop rebound or resized
        self.too_many = False
        self.ignored: set[str] = set()  # dunders and the loop variable
        self.static: dict[str, int] = {}  # name -> id of the module, function or class it held at the start
        self.opaque: set[type] = set()  # types that are never plain data (checked once per type)
        self.initial: dict[str, Any] = {}  # plain variables at the loop's start: name -> same_key(encoded)
        self.touched: set[str] = set()  # ... that some epoch so far ended with another value (or bound anew)

    def variables(self) -> dict[str, Any]:
        frame = self.frame
        if frame is None:
            return {}
        return frame.f_locals if self.function else frame.f_globals

    def start(self, *, loop: bool = True) -> None:
        """At the loop's first step: the loop variable, and the non-plain variables bound
        before the loop (they are state the loop may change). ``loop=False``: at a block's
        entry, which binds no loop variable."""
        if self.frame is None:
            return
        self.targets = loop_targets(self.frame) if loop else set()
        for name, value in list(self.variables().items()):
            if skipped_name(name) or name in self.targets:
                self.ignored.add(name)
            elif not state_like(value):
                self.static[name] = id(value)  # an import, a def: skipped cheaply while it stays
            elif type(value) not in SCALARS:
                self.before[name] = identity_and_size(value)
        self.ignored |= self.targets
        self.initial = {name: same_key(v) for name, v in self.plain().items()}

    def capture(self, passed: Iterable[int] = ()) -> dict[str, Any]:
        """``{"vars": {name: encoded}, "unrestorable": [names], "unchanged": [names]}`` of the
        frame now; unchanged: the variables that held their loop-start value at every capture."""
        out = self.plain(passed)
        initial, touched = self.initial, self.touched
        for name, value in out.items():
            if name not in touched and (name not in initial or same_key(value) != initial[name]):
                touched.add(name)
        return {"vars": out, "unrestorable": sorted(self.changed - out.keys()),
                "unchanged": sorted(name for name in out if name not in touched)}

    def plain(self, passed: Iterable[int] = (), skip: Collection[int] = ()) -> dict[str, Any]:
        """``{name: encoded}`` of the frame's plain-data variables now, but for the containers
        whose ids are in ``skip`` (given to ``end()``: checkpointed, not encoded here); names the others."""
        out: dict[str, Any] = {}
        passed = set(passed)
        ignored, static = self.ignored, self.static
        for name, value in list(self.variables().items()):
            if name in ignored:
                continue
            kind = type(value)
            if kind in NUMBERS:  # the common case, without a call
                out[name] = value
                continue
            if static.get(name) == id(value):
                continue
            if kind in self.opaque:  # before the name: most variables are models, tensors, loaders
                if self.track and not skipped_name(name):
                    self._not_plain(name, value, passed)
                continue
            if skipped_name(name):  # bound inside the loop
                ignored.add(name)
                continue
            if skip and id(value) in skip:
                continue
            if kind not in CONTAINERS and not scalar_like(value) and not isinstance(value, LEAF_TYPES):
                if not maybe_scalar(kind):
                    self.opaque.add(kind)  # a model, a loader, a Namespace: never plain data
                self._not_plain(name, value, passed)
                continue
            try:
                out[name] = encode(value, self.limit)
            except NotPlain:
                self._not_plain(name, value, passed)
            except Exception:  # noqa: BLE001 - an odd value (a tensor whose item() fails) is just not noted
                continue
            if len(out) >= LIMITS.variables:
                self.too_many = True
                break
        return out

    def _not_plain(self, name: str, value: Any, passed: set[int]) -> None:
        """``name`` holds what cannot be noted: named when it was there before the loop and the
        loop rebound or resized it, or it held plain data then (``best_state = None``, later
        a copy of the weights), and it is not given to ``end()``."""
        if not self.track or id(value) in passed:
            return
        was = self.before.get(name)
        if (was is not None and identity_and_size(value) != was) or name in self.initial:
            self.changed.add(name)

    def restore(self, values: dict[str, Any], *, replace: bool = False) -> list[str]:
        """Write ``values`` into the frame; return the names that could not be written. ``replace``:
        also over what is not plain data now (a carried batch: ``flor.watch.carried``)."""
        frame = self.frame
        if frame is None or not values:
            return []
        current = self.variables()
        # a name the script now binds to something that is not plain data is left alone
        values = {k: v for k, v in values.items() if replace or k not in current or plain_now(current[k])}
        if not self.function:
            frame.f_globals.update(values)
            return []
        code = frame.f_code
        local_names = set(code.co_varnames) | set(code.co_cellvars) | set(code.co_freevars)
        skipped = sorted(k for k in values if k not in local_names)
        values = {k: v for k, v in values.items() if k in local_names}
        if sys.version_info >= (3, 13):  # PEP 667: f_locals writes through
            proxy = frame.f_locals
            for k, v in values.items():
                proxy[k] = v
            return skipped
        try:
            import ctypes

            to_fast = ctypes.pythonapi.PyFrame_LocalsToFast
        except (ImportError, AttributeError):
            return sorted(values) + skipped
        frame.f_locals.update(values)
        to_fast(ctypes.py_object(frame), ctypes.c_int(0))
        return skipped

    def close(self) -> None:
        self.frame = None  # a function's frame keeps its locals alive: let go after the loop


# -- a block's own variables ---------------------------------------------------------------


# -- the file ------------------------------------------------------------------------------


class StateFile:
    """``logs/state.jsonl`` of a recording: one JSON line per epoch with the loop's own variables
    (``LoopState``), and one per block run whose code before it changed the model in place
    (``{"block", "occ", "outside"}``, ``flor.watch.outside``). Appends; never raises into training."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None
        self.failed: str | None = None

    def write(self, epoch: int | None, record: dict[str, Any]) -> None:
        if self.failed is not None:
            return
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = os.fdopen(open_append(self.path), "a", encoding="utf-8")  # never through a link
            self._file.write(json.dumps({"epoch": epoch, **record}, separators=(",", ":"), allow_nan=True) + "\n")
            self._file.flush()
        except (OSError, ValueError, TypeError) as exc:
            self.failed = str(exc)
            from ..errors import warn

            warn("FL210", f"writing the loop's state to {self.path} failed ({exc}); a replay will name the variables "
                 "it cannot restore")

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


class State(NamedTuple):
    """What ``read_state`` found: the loop's state by epoch (values still encoded), and the
    in-place changes outside the blocks noted before each block run."""

    loop: dict[int, dict[str, Any]]
    outside: dict[tuple[int | None, str, int], dict[str, int]]


def read_state(path: Path) -> State:
    """``logs/state.jsonl``, read as untrusted input: a line of another shape is ignored, names
    are strings, counts ints; the last line of a key wins (a resumed recording appends again).
    Empty when there is none."""
    found = State({}, {})
    try:
        lines = read_text(path).splitlines()  # a regular file of at most MAX_METADATA, no link followed
    except StoreFileError as exc:  # a FIFO, a link, a huge file in its place: as if nothing was noted
        from ..errors import warn

        warn("FL413", f"ignoring {exc.strerror}")
        return found
    except OSError:
        return found
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        epoch = rec.get("epoch")
        if epoch is not None and type(epoch) is not int:
            continue
        if "block" in rec:
            block, occ, outside = rec.get("block"), rec.get("occ"), rec.get("outside")
            if type(block) is str and type(occ) is int and isinstance(outside, dict):  # compared, never acted on
                found.outside[(epoch, block, occ)] = {k: v for k, v in list(outside.items())[:LIMITS.outside]
                                                      if isinstance(k, str) and len(k) <= 400 and type(v) is int}
        elif type(epoch) is int and isinstance(rec.get("vars"), dict) \
                and isinstance(rec.get("unchanged"), list):  # a line without "unchanged" is damaged
            for part in ("unrestorable", "unchanged"):
                names = rec.get(part)
                rec[part] = [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
            found.loop[epoch] = rec
    return found


class LoopState:
    """The loop's own variables for a session: noted at an epoch's end while recording
    (``epoch_end``), set before a mid-run worker's first epoch while replaying (``restore``).
    Never raises into training; a replay's restore says what it set and names what it could not."""

    def __init__(self, frame: FrameType | None, file: StateFile | None = None) -> None:
        self.loop = LoopFrame(frame) if frame is not None else None
        self.file = file  # where a recording notes it
        self.seconds = 0.0  # noting, all epochs together: charged to the overhead budget

    def start(self) -> None:
        if self.loop is not None:
            self.loop.start()

    def epoch_end(self, epoch: int, passed: Iterable[int]) -> None:
        """Note the state the next epoch starts from, for a replay worker that starts there."""
        if self.loop is None or self.file is None:
            return
        t0 = time.perf_counter()
        try:
            state = self.loop.capture(passed)
        except Exception as exc:  # noqa: BLE001 - never stops training; a replay names what is missing
            state = {"vars": {}, "unrestorable": [], "error": repr(exc)}
        self.file.write(epoch, state)
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()

    def restore(self, state: State, after: int, say: Say, *, strict: bool = False) -> tuple[list[str], list[str]]:
        """Give the loop's own variables (best value, patience, EMA, counters) the values the
        recording had at the end of epoch ``after`` (``read_state``); ``(set, left)``: the names set as recorded, and
        those this worker cannot restore (``strict``: a ReplayError instead)."""
        loop = self.loop
        if loop is None:
            return [], []
        missing: list[str] = []
        try:
            rec = state.loop.get(after)
            if rec is None:
                say("FL319", after, f"the recording has no outer-loop state for epoch {after} "
                    "(its write failed, or the file is damaged): "
                    "variables of the loop outside end() start as the script sets them before the loop; replay "
                    "with --flor_strong if they matter")
                return [], []
            values, missing = {}, list(rec["unrestorable"])
            own = set(rec["unchanged"]) & set(rec["vars"])
            for name, node in rec["vars"].items():
                if name in own:  # the loop had not changed it: as this worker's code before the loop set it
                    continue
                try:
                    values[str(name)] = decode(node)
                except (ValueError, TypeError, AttributeError):
                    missing.append(str(name))
            missing += loop.restore(values)
            missing = needed(loop.frame, missing)
            restored = sorted(set(values) - set(missing))
            if restored:
                say("FL320", "set", f"outer-loop variables restored as recorded at the end of epoch {after}: "
                    f"{listed(restored, 12)}")
            if own:
                say("FL320", "own", f"outer-loop variables the recording's loop had not changed by epoch {after}, "
                    f"left as this worker set them before the loop: {listed(sorted(own), 12)}")
        finally:
            loop.close()
        if missing:
            names = ", ".join(sorted(set(missing)))
            text = (f"outer-loop variables of {loop.where} that this worker (starting at epoch {after + 1}) "
                    f"cannot restore: {names}. They are not plain data (or too big) and changed in the loop; "
                    "pass them to SkipBlock.end(), or replay with --flor_strong")
            if strict:
                raise ReplayError(text + " (--flor_strict)")
            say("FL322", None, text)
        return restored, sorted(set(missing))


def needed(frame: FrameType | None, names: list[str]) -> list[str]:
    """Those of ``names`` (the loop's variables a worker cannot restore) that the next epoch may
    need: read by the loop's body before it binds them, or by code outside the loop, and not
    carried by a block (its checkpoint holds them: ``flor.watch.carried``). A variable bound in
    a block and read only there after binding (nanoGPT's ``checkpoint`` dict) is not state. All
    of them where the script's source cannot be read. Never raises."""
    try:
        tree = script_tree(frame) if frame is not None else None
        found = loop_names(tree, frame.f_lineno) if tree is not None and frame is not None else None
    except Exception:  # noqa: BLE001 - advice only: every name stays
        found = None
    if found is None:
        return names
    live, carried = found
    return [name for name in names if name in live and name not in carried]
