"""Values a block run binds that its next run reads before binding them: a prefetched batch
(nanoGPT's ``X, Y = get_batch("train")`` at the end of each iteration, read by the next one's
forward), a hidden state carried across chunks, a running tensor.

They are state like what ``end()`` is given: a replay that restores the block's run skips its
body, so without help the next run (re-executed after a restored one, or a worker's first run
after its initialization) starts from the value bound before the block, and every value after
it differs from a full run. ``flor.source.blocks.carried_names`` finds these names in the
script's syntax tree. While recording, a checkpointed run keeps the tensors and arrays among
them (``LIMITS.carried`` bytes at most, all together) in its checkpoint, through the same codec
as the objects ``end()`` is given (the manifest's ``"carried"`` tree); a replay that restores
the run sets them (``restore``), and one that re-executes it from its checkpoint compares what
the run left in them with the recording's, by digest like the objects (``compare``: a difference
is a divergence of the block). What cannot be kept (past the limit, not a tensor or array) is
named at record (FL211), and every replay that restores a run without it names it (FL336) and
qualifies its verdict.

Plain data the block changes (a counter, a loss) is noted by ``VariablesProbe``, which runs first.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Iterable

from .._fmt import human_size, listed
from ..source.blocks import carried_names, script_tree, unread_outside
from .frames import skipped_name
from .limits import LIMITS
from .loop import LoopFrame
from .plain import SCALARS
from .probe import Probe, Say, View

__all__ = ["CarriedProbe", "carried_at", "carried_bytes", "not_state"]


def carried_at(site: tuple[str, int] | None, frame: FrameType | None) -> set[str]:
    """``carried_names`` of the block entered at ``site`` (file, line) and ended in ``frame``. Never raises."""
    try:
        if site is None or frame is None or frame.f_code.co_filename != site[0]:
            return set()
        tree = script_tree(frame)
        return carried_names(tree, site[1], frame.f_lineno) if tree is not None else set()
    except Exception:  # noqa: BLE001 - advice only
        return set()


def not_state(site: tuple[str, int] | None, frame: FrameType | None, names: Iterable[str]) -> set[str]:
    """Those of ``names`` that nothing outside the block entered at ``site`` reads and that it
    binds before reading (``unread_outside``): not state, whatever they hold. Never raises."""
    try:
        if site is None or frame is None or frame.f_code.co_filename != site[0]:
            return set()
        tree = script_tree(frame)
        return unread_outside(tree, site[1], names) if tree is not None else set()
    except Exception:  # noqa: BLE001 - advice only
        return set()


def carried_bytes(value: Any) -> int | None:
    """The bytes of a tensor or NumPy array, or of a tuple, list or dict of them (a batch); None
    for anything else.

    >>> import torch
    >>> carried_bytes((torch.zeros(4, 8, dtype=torch.int64), torch.zeros(4, 8, dtype=torch.int64)))
    512
    >>> print(carried_bytes(iter([])))
    None
    """
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    if torch is not None and isinstance(value, torch.Tensor):
        return 0 if value.is_sparse else value.numel() * value.element_size()
    if np is not None and isinstance(value, np.ndarray):
        return int(value.nbytes) if value.dtype.kind in "biufc" else None
    items = list(value.values()) if type(value) is dict else list(value) if type(value) in (tuple, list) else None
    if not items or len(items) > LIMITS.reach_items:
        return None
    sizes = [carried_bytes(v) for v in items]
    return None if any(n is None for n in sizes) else sum(n for n in sizes if n is not None)


class CarriedProbe(Probe):
    """A block's carried values (``carried_names``): kept with a checkpointed run (put in
    ``view.noted["carried"]``, which the recording stores as the manifest's ``"carried"`` tree),
    set by a replay that restores the run (``noted["carried_values"]``: that tree decoded)."""

    quiet = frozenset()  # at checkpointed runs and a block's first only (Probe.quiet)

    def __init__(self) -> None:
        self.sites: dict[str, tuple[str, int] | None] = {}
        self.names: dict[str, set[str]] = {}  # block -> the names it carries, from the script's tree
        self.said: set[tuple[str, str]] = set()

    def enter(self, view: View, say: Say) -> None:
        if view.block not in self.sites:
            frame = view.frame
            self.sites[view.block] = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)

    def carried(self, view: View) -> set[str]:
        names = self.names.get(view.block)
        if names is None:
            names = self.names[view.block] = {n for n in carried_at(self.sites.get(view.block), view.frame)
                                              if not skipped_name(n)}
        return names

    def _state(self, view: View, noted: dict[str, Any]) -> dict[str, Any]:
        """The carried names bound now to what is neither given to end(), nor plain data noted as a
        variable, nor a scalar: ``{name: value}``."""
        plain = noted.get("vars", {})
        variables = view.variables
        return {var: variables[var] for var in sorted(self.carried(view))
                if var in variables and var not in plain and id(variables[var]) not in view.given
                and type(variables[var]) not in SCALARS}

    def leave(self, view: View, say: Say) -> None:
        if view.replay or not (view.note or view.first):  # a run without a checkpoint notes nothing
            return
        kept: dict[str, Any] = {}
        left: list[str] = []
        total = 0
        for var, value in self._state(view, view.noted).items():
            n = carried_bytes(value)
            if n is not None and total + n <= LIMITS.carried:
                kept[var] = value
                total += n
                continue
            left.append(var)
            if (view.block, var) in self.said:
                continue
            self.said.add((view.block, var))
            why = (f"{human_size(n)}, more than the {human_size(LIMITS.carried)} flor keeps with a block's checkpoint"
                   if n is not None else "not a tensor or array flor can keep with the block's checkpoint")
            say("FL211", (view.block, var),
                f"SkipBlock {view.block!r} binds `{var}` and its next run reads it before binding it (a value carried "
                f"from one run into the next: a prefetched batch, a hidden state), but it is {why}: a replay that "
                f"restores a run of {view.block!r} starts the next from another `{var}`, so its values differ from a "
                f"full run; pass it to SkipBlock.end(..., {var}) and use what end() returns, or bind it anew at the "
                "start of the block")
        view.named.update(kept)  # set where the block is restored: not stale (NamesProbe)
        if view.note:
            if kept:
                view.noted["carried"] = kept  # stored with the checkpoint's objects (flor.engine.checkpointer)
            if left:
                view.noted["carried_left"] = left

    def restore(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        """Set the carried values the checkpoint holds; name those the script carries that it does
        not hold (an older recording, a value past the limit): they stay as they were."""
        wanted = self._state(view, noted)
        values = noted.get("carried_values") or {}
        values = {var: v for var, v in values.items() if var in self.carried(view)} if isinstance(values, dict) else {}
        missing = LoopFrame(view.frame).restore(values, replace=True) if view.frame is not None and values else []
        done = sorted(set(values) - set(missing))
        view.named.update(done)
        left = sorted((set(wanted) - set(done)) | set(missing))
        if done and (view.block, "set") not in self.said:
            self.said.add((view.block, "set"))
            say("FL335", (view.block, "set"), f"values block {view.block!r} carries into its next run are set as "
                f"recorded where it is restored: {listed(done, 12)}")
        fresh = [var for var in left if (view.block, var) not in self.said]
        if fresh:
            self.said.update((view.block, var) for var in fresh)
            say("FL336", (view.block, tuple(fresh)),
                f"block {view.block!r} binds {listed([f'`{v}`' for v in fresh], 8)} and its next run reads "
                f"{'them' if len(fresh) > 1 else 'it'} before binding (a carried value), but the checkpoint restored "
                f"at epoch {view.epoch} does not hold {'them' if len(fresh) > 1 else 'it'}: the next run starts from "
                "another value than a full run; pass them to SkipBlock.end(...) and record again")
        return left

    def compare(self, view: View, noted: dict[str, Any], say: Say) -> list[str]:
        """A re-executed run's carried values against the checkpoint's (``noted["carried_tree"]``: the
        manifest's ``"carried"`` tree, hashes and shapes), by digest as ``Restorer.verify`` compares
        the objects: ``carried `X```-like names of those that differ. Only the values the checkpoint
        holds are compared (one past the limit was named at record)."""
        tree = noted.get("carried_tree")
        if not isinstance(tree, dict) or tree.get("t") != "dict" or not isinstance(tree.get("k"), list):
            return []
        from ..state import diff_nodes, snapshot

        values = self._state(view, {})
        kept = [var for var in tree["k"] if isinstance(var, str)]
        if not kept:
            return []
        # one the run no longer binds (or binds to what is not carried state) differs as a whole
        now = snapshot({var: values.get(var) for var in kept}, copy=False).materialize()
        return sorted({f"carried `{path.split('.')[0].split('[')[0]}`" for path in diff_nodes(tree, now)})
